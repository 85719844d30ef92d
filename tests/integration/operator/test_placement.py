"""Where a GRPOJob's GPU pods go, on the real control plane with the real KubeRay operator and kwok nodes shaped
like a common cloud GPU node (one GPU, 8 vCPUs, 32 GiB, of which about 7.9 CPUs and 27 GiB allocatable): a
colocated job (the default for an on-policy job) holds its engine and its policy rank on one such node, a split
job takes two, and a pod that no node can hold keeps the job waiting with the scheduler's reason in its status."""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client

from grpojob_testing.nodes import fake_node

from .conftest import eventually, job_manifest

pytestmark = pytest.mark.integration

POOL_LABEL = "grpojob.dev/pool"


@pytest.fixture
def one_gpu_nodes(api_client, fake_gpu_nodes):
    """Two one-GPU nodes of 8 vCPUs and 32 GiB (allocatable 7910m and 27Gi, as a cloud provider reserves for
    the system) and a CPU node, of a pool of this test's own, tainted so that no other pod lands there."""
    core = client.CoreV1Api(api_client)
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    nodes = [fake_node(f"{pool}-gpu-{i}", cpu="8", memory="32Gi", gpus=1) for i in range(2)]
    for node in nodes:
        node["status"]["allocatable"] |= {"cpu": "7910m", "memory": "27Gi"}
    nodes.append(fake_node(f"{pool}-cpu", cpu="16", memory="64Gi"))
    for node in nodes:
        node["metadata"]["labels"][POOL_LABEL] = pool
        node["spec"]["taints"] = [
            *node["spec"].get("taints", []),
            {"key": POOL_LABEL, "value": pool, "effect": "NoSchedule"},
        ]
        core.create_node(node)
    try:
        yield pool, [n["metadata"]["name"] for n in nodes[:2]]
    finally:
        for node in nodes:
            core.delete_node(node["metadata"]["name"])


def in_pool(pool: str) -> dict:
    """Every role's scheduling: onto the pool's nodes (GPU pods onto its GPU nodes by their GPU request)."""
    role = {
        "nodeSelector": {POOL_LABEL: pool},
        "tolerations": [{"key": POOL_LABEL, "operator": "Equal", "value": pool, "effect": "NoSchedule"}],
    }
    return dict.fromkeys(("head", "generation", "policy", "environments", "trainer"), role)


ONE_GPU_EACH = {"generation": {"replicas": 1, "gpusPerReplica": 1}, "training": {"replicas": 1, "gpusPerReplica": 1}}


def test_a_colocated_job_holds_engine_and_policy_on_one_gpu_node_of_8_cpus_and_32_gib(operator, jobs, one_gpu_nodes):
    pool, gpu_nodes = one_gpu_nodes
    jobs.create(job_manifest("together", scheduling=in_pool(pool), **ONE_GPU_EACH))
    jobs.wait_phase("together", "Running")

    status = jobs.status("together")
    assert status["placement"] == "colocated"
    cluster = jobs.custom.get_namespaced_custom_object("ray.io", "v1", jobs.namespace, "rayclusters", "together")
    assert [g["groupName"] for g in cluster["spec"]["workerGroupSpecs"]] == ["colocated"]
    (worker,) = jobs.pods("ray.io/cluster=together,ray.io/node-type=worker")
    assert worker.metadata.labels["ray.io/group"] == "colocated"
    assert worker.spec.node_name in gpu_nodes
    requests = worker.spec.containers[0].resources.requests
    assert (requests["cpu"], requests["memory"], requests["nvidia.com/gpu"]) == ("4", "24Gi", "1")
    # The policy endpoint is the colocated pod: the generation Service selects it.
    service = jobs.core.read_namespaced_service("together-generation", jobs.namespace)
    assert service.spec.selector.items() <= worker.metadata.labels.items()


def test_a_split_job_takes_one_gpu_node_for_its_engine_and_another_for_its_policy(operator, jobs, one_gpu_nodes):
    pool, gpu_nodes = one_gpu_nodes
    jobs.create(job_manifest("apart", scheduling=in_pool(pool), placement="split", **ONE_GPU_EACH))
    jobs.wait_phase("apart", "Running")

    assert jobs.status("apart")["placement"] == "split"
    workers = jobs.pods("ray.io/cluster=apart,ray.io/node-type=worker")
    assert sorted(p.metadata.labels["ray.io/group"] for p in workers) == ["generation", "policy"]
    assert sorted(p.spec.node_name for p in workers) == sorted(gpu_nodes)


def test_a_worker_pod_no_node_can_hold_keeps_the_job_waiting_and_says_why(operator, jobs, one_gpu_nodes):
    pool, _ = one_gpu_nodes
    too_big = {**ONE_GPU_EACH, "training": {**ONE_GPU_EACH["training"], "resources": {"cpu": "8", "memory": "32Gi"}}}
    jobs.create(job_manifest("oversized", scheduling=in_pool(pool), **too_big))

    def says_why() -> bool:
        condition = jobs.condition("oversized", "RayClusterReady") or {}
        return "cannot be scheduled" in condition.get("message", "")

    eventually(says_why, "the RayClusterReady condition to name the pod the scheduler cannot place")
    message = jobs.condition("oversized", "RayClusterReady")["message"]
    assert "Insufficient cpu" in message or "Insufficient memory" in message, message
    assert jobs.status("oversized")["phase"] == "Initializing"
