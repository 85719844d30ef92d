"""A GRPOJob on a cluster shared with other users, on the real control plane with the real KubeRay
operator and kwok nodes: the job's Ray cluster is closed to strangers (token auth, no Kubernetes API
token in the Ray pods, read-only roots, a NetworkPolicy), each role's pods go where the job's
scheduling says, and a trainer that stops making progress is retried as stalled."""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client

from grpojob_testing.nodes import fake_node

from .conftest import eventually, job_manifest

pytestmark = pytest.mark.integration

SERVICE_ACCOUNT_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


def _container(pod, name: str):
    return next(c for c in pod.spec.containers if c.name == name)


def _env(container) -> dict:
    return {var.name: var for var in container.env or []}


def test_the_jobs_ray_cluster_runs_with_token_auth_and_without_an_api_token(operator, jobs, namespace):
    jobs.create(job_manifest("sealed"))
    jobs.wait_phase("sealed", "Running")

    # KubeRay made the job's token, in a Secret of the RayCluster's name, owned by the RayCluster.
    secret = jobs.core.read_namespaced_secret("sealed", namespace)
    assert secret.data["auth_token"]
    assert [(o.kind, o.name) for o in secret.metadata.owner_references] == [("RayCluster", "sealed")]

    ray_pods = jobs.pods("ray.io/cluster=sealed")
    assert sorted(p.metadata.labels["ray.io/node-type"] for p in ray_pods) == ["head", "worker", "worker"]
    (trainer,) = jobs.trainer_pods("sealed")
    for pod in [*ray_pods, trainer]:
        container = pod.spec.containers[0]
        for each in [*(pod.spec.init_containers or []), container]:  # KubeRay's wait-for-GCS too
            env = _env(each)
            assert env["RAY_AUTH_MODE"].value == "token", (pod.metadata.name, each.name)
            token = env["RAY_AUTH_TOKEN"].value_from.secret_key_ref
            assert (token.name, token.key) == ("sealed", "auth_token"), (pod.metadata.name, each.name)
        assert container.security_context.read_only_root_filesystem is True

    # The Ray pods run with no Kubernetes API token (the apiserver mounted none) and write to /tmp only.
    for pod in ray_pods:
        assert pod.spec.automount_service_account_token is False
        mounts = [m.mount_path for c in pod.spec.containers for m in c.volume_mounts or []]
        assert SERVICE_ACCOUNT_TOKEN_PATH not in mounts and "/tmp" in mounts, pod.metadata.name

    # Only the job's own pods reach the job's pods: the NetworkPolicy selects every one of them.
    policy = client.NetworkingV1Api(jobs.core.api_client).read_namespaced_network_policy("sealed-network", namespace)
    own = policy.spec.pod_selector.match_labels
    assert own == {"grpo.dev/job": "sealed", "grpo.dev/job-uid": jobs.get("sealed")["metadata"]["uid"]}
    assert policy.spec.policy_types == ["Ingress"]
    rule, readers = policy.spec.ingress
    assert [peer.pod_selector.match_labels for peer in rule._from] == [own]
    assert not rule._from[0].namespace_selector and not rule._from[0].ip_block and not rule.ports
    assert sorted(p.port for p in readers.ports) == [6006, 9090] and not readers._from  # metrics, TensorBoard
    for pod in jobs.pods("grpo.dev/job=sealed"):
        assert own.items() <= pod.metadata.labels.items(), pod.metadata.name


@pytest.fixture
def node_pool(api_client, fake_gpu_nodes):
    """A CPU node and an 8-GPU node of a pool of this test's own, tainted so that no other pod lands
    there, and a PriorityClass; all removed afterwards."""
    core, scheduling = client.CoreV1Api(api_client), client.SchedulingV1Api(api_client)
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    taint = {"key": "grpojob.dev/pool", "value": pool, "effect": "NoSchedule"}
    nodes = {"cpu": fake_node(f"{pool}-cpu", cpu="16", memory="64Gi")}
    nodes["gpu"] = fake_node(f"{pool}-gpu", cpu="96", memory="1536Gi", gpus=8)
    for node in nodes.values():
        node["metadata"]["labels"]["grpojob.dev/pool"] = pool
        node["spec"]["taints"] = [*node["spec"].get("taints", []), taint]
        core.create_node(node)
    priority = scheduling.create_priority_class({"metadata": {"name": f"{pool}-high"}, "value": 1000})
    try:
        yield pool, {kind: node["metadata"]["name"] for kind, node in nodes.items()}, priority.metadata.name
    finally:
        for node in nodes.values():
            core.delete_node(node["metadata"]["name"])
        scheduling.delete_priority_class(priority.metadata.name)


def test_each_role_runs_where_its_scheduling_says(operator, jobs, namespace, node_pool):
    pool, nodes, priority = node_pool
    tolerate = [{"key": "grpojob.dev/pool", "operator": "Equal", "value": pool, "effect": "NoSchedule"}]
    on_cpu = {"nodeSelector": {"grpojob.dev/pool": pool, "grpojob.dev/test-node-role": "cpu"}, "tolerations": tolerate}
    hostname = {"key": "kubernetes.io/hostname", "operator": "In", "values": [nodes["gpu"]]}
    affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [hostname]}]}
    }
    scheduling = {
        "head": {**on_cpu, "annotations": {"team.example/owner": "rl"}},
        "generation": {"tolerations": tolerate, "affinity": {"nodeAffinity": affinity}},
        "policy": {"nodeSelector": {"grpojob.dev/pool": pool}, "tolerations": tolerate, "labels": {"team": "rl"}},
        "environments": on_cpu,
        "trainer": {**on_cpu, "priorityClassName": priority},
    }
    jobs.create(job_manifest("placed", scheduling=scheduling))
    jobs.wait_phase("placed", "Running")

    def pods_of(selector: str) -> list:
        found = jobs.pods(selector)
        assert found, selector
        return found

    (head,) = pods_of("ray.io/cluster=placed,ray.io/node-type=head")
    (generation,) = pods_of("ray.io/cluster=placed,ray.io/group=generation")
    (policy,) = pods_of("ray.io/cluster=placed,ray.io/group=policy")
    (environment,) = pods_of("grpo.dev/job=placed,grpo.dev/component=environment")
    (trainer,) = jobs.trainer_pods("placed")
    assert {p.spec.node_name for p in (head, environment, trainer)} == {nodes["cpu"]}
    assert generation.spec.node_name == policy.spec.node_name == nodes["gpu"]
    assert head.metadata.annotations["team.example/owner"] == "rl"
    assert policy.metadata.labels["team"] == "rl" and policy.metadata.labels["grpo.dev/component"] == "policy"
    # The admission plugin resolved the priority class of the trainer, and of it alone.
    assert (trainer.spec.priority_class_name, trainer.spec.priority) == (priority, 1000)
    assert head.spec.priority_class_name is None and generation.spec.priority_class_name is None


def test_a_role_label_the_operator_owns_is_refused_by_kubectl_apply(operator, jobs):
    manifest = job_manifest("relabel", scheduling={"trainer": {"labels": {"kueue.x-k8s.io/queue-name": "gpu"}}})
    with pytest.raises(client.ApiException) as refused:
        jobs.create(manifest)
    assert refused.value.status == 422
    assert "spec.scheduling.trainer.labels" in refused.value.body and "must not use the keys" in refused.value.body


def test_a_trainer_that_stops_making_progress_is_retried_as_stalled_then_the_job_fails(operator, jobs, namespace):
    jobs.create(job_manifest("quiet", progressDeadlineSeconds=4, backoffLimit=1))
    jobs.wait_trainer_pod("quiet", 1)
    jobs.core.patch_namespaced_config_map("quiet-config", namespace, {"data": {"step": "2"}})
    # The step never advances again while the trainer pod keeps running: attempt 1 is stalled.
    second = jobs.wait_trainer_pod("quiet", 2, timeout=90)
    stalled = jobs.condition("quiet", "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "NoProgress"
    assert "made no progress for 4s (spec.progressDeadlineSeconds)" in stalled["message"]
    assert jobs.status("quiet")["attempt"] == 2
    assert not [p for p in jobs.trainer_pods("quiet") if p.metadata.labels["grpo.dev/attempt"] == "1"]
    assert second.status.phase == "Running"
    # Attempt 2 stalls too, and was the last one spec.backoffLimit allows.
    status = jobs.wait_phase("quiet", "Failed", timeout=90)
    assert status["reason"] == "BackoffLimitExceeded" and "made no progress" in status["message"]
    eventually(lambda: "NoProgress" in {reason for reason, _ in jobs.events("quiet")}, "a NoProgress event", 30)
