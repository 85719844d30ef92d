"""The test control plane is real: the KubeRay operator, kube-scheduler, kwok and the garbage
collector of kube-controller-manager all do their part for a RayCluster with a GPU worker group."""

from __future__ import annotations

import pytest
from kubernetes import client

from grpojob_testing.cluster import wait_until
from grpojob_testing.nodes import GPU_RESOURCE, NODE_ROLE_LABEL

pytestmark = pytest.mark.integration

RAY_IMAGE = "rayproject/ray:2.60.0"


def raycluster(name: str, gpu_workers: int) -> dict:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name},
        "spec": {
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "ray-head",
                                "image": RAY_IMAGE,
                                "resources": {"requests": {"cpu": "2", "memory": "4Gi"}},
                            }
                        ]
                    }
                },
            },
            "workerGroupSpecs": [
                {
                    "groupName": "gpu",
                    "replicas": gpu_workers,
                    "minReplicas": gpu_workers,
                    "maxReplicas": gpu_workers,
                    "rayStartParams": {},
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "ray-worker",
                                    "image": RAY_IMAGE,
                                    "resources": {
                                        "requests": {"cpu": "8", "memory": "64Gi", GPU_RESOURCE: "8"},
                                        "limits": {GPU_RESOURCE: "8"},
                                    },
                                }
                            ]
                        }
                    },
                }
            ],
        },
    }


def test_raycluster_runs_on_fake_gpu_nodes_and_is_garbage_collected(api_client, namespace, fake_gpu_nodes):
    core = client.CoreV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    name = "smoke"
    selector = f"ray.io/cluster={name}"
    custom.create_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", raycluster(name, gpu_workers=3))

    def pods() -> list:
        return core.list_namespaced_pod(namespace, label_selector=selector).items

    def all_pods_running_and_ready() -> bool:
        current = pods()
        return len(current) == 4 and all(
            p.status.phase == "Running"
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
            for p in current
        )

    wait_until(all_pods_running_and_ready, "the head and 3 GPU workers to be Running and Ready", 120)

    service = core.read_namespaced_service(f"{name}-head-svc", namespace)
    assert service.spec.selector["ray.io/cluster"] == name

    roles = {n.metadata.name: n.metadata.labels[NODE_ROLE_LABEL] for n in core.list_node().items}
    by_type: dict[str, list[str]] = {"head": [], "worker": []}
    for pod in pods():
        by_type[pod.metadata.labels["ray.io/node-type"]].append(roles[pod.spec.node_name])
    assert by_type["head"] == ["cpu"], "the CPU-only head must stay off the tainted GPU nodes"
    assert by_type["worker"] == ["gpu"] * 3, "GPU workers must be bound to GPU nodes"
    # 3 workers x 8 GPUs cannot share a node: the scheduler honoured the GPU capacity.
    assert len({p.spec.node_name for p in pods() if p.metadata.labels["ray.io/node-type"] == "worker"}) == 3

    def head_pod_ready() -> bool:
        status = custom.get_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", name).get("status", {})
        return any(c["type"] == "HeadPodReady" and c["status"] == "True" for c in status.get("conditions", []))

    wait_until(head_pod_ready, "the RayCluster's HeadPodReady condition", 60)

    custom.delete_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", name)
    wait_until(lambda: not pods(), "the garbage collector to delete the RayCluster's pods", 60)

    def head_service_gone() -> bool:
        return not core.list_namespaced_service(namespace, field_selector=f"metadata.name={name}-head-svc").items

    wait_until(head_service_gone, "the garbage collector to delete the head Service", 60)


def test_kuberay_reconciles_as_many_rayclusters_at_once_as_the_test_clusters_pin(kubeconfig, api_client):
    """KubeRay's default of one RayCluster at a time queued heads for minutes at 1,000 jobs; the test
    clusters run it with `grpojob_testing.kuberay.RECONCILE_CONCURRENCY`: on the loopback cluster its own
    metrics say so, on kind (its metrics port inside a pod) its Deployment's arguments do."""
    import os
    import urllib.request

    from grpojob_testing import kuberay
    from grpojob_testing.cluster import Cluster
    from grpojob_testing.kind import KUBERAY_NAMESPACE

    if os.environ.get("GRPOJOB_TEST_KUBECONFIG"):
        deployment = client.AppsV1Api(api_client).read_namespaced_deployment("kuberay-operator", KUBERAY_NAMESPACE)
        args = deployment.spec.template.spec.containers[0].args
        assert f"--reconcile-concurrency={kuberay.RECONCILE_CONCURRENCY}" in args, args
        return
    cluster = Cluster(kubeconfig.parent)
    cluster.load()
    port = cluster.ports["kuberay-metrics"]
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()

    limits = {
        line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("controller_runtime_max_concurrent_reconciles{")
    }
    raycluster = [value for labels, value in limits.items() if 'controller="raycluster' in labels]
    assert raycluster == [kuberay.RECONCILE_CONCURRENCY], limits


def test_a_pod_the_node_controller_marked_not_ready_is_ready_again_as_its_kubelet_reports(
    api_client, namespace, fake_gpu_nodes
):
    """kube-controller-manager marks a node's pods NotReady when the node's lease is late (kwok's leases on a
    loaded machine); a real kubelet reports them Ready again once it is back, and so do kwok's fake ones."""
    core = client.CoreV1Api(api_client)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "marked"},
        "spec": {"containers": [{"name": "main", "image": RAY_IMAGE}], "tolerations": [{"operator": "Exists"}]},
    }
    core.create_namespaced_pod(namespace, pod)

    def ready() -> str:
        conditions = core.read_namespaced_pod_status("marked", namespace).status.conditions or []
        return next((c.status for c in conditions if c.type == "Ready"), "")

    wait_until(lambda: ready() == "True", "the pod to be Ready", 60)
    status = core.read_namespaced_pod_status("marked", namespace).status
    marked = [{"type": c.type, "status": "False" if c.type == "Ready" else c.status} for c in status.conditions or []]
    patched = core.patch_namespaced_pod_status("marked", namespace, {"status": {"conditions": marked}})
    assert [c.status for c in patched.status.conditions if c.type == "Ready"] == ["False"], "marked NotReady"
    wait_until(lambda: ready() == "True", "kwok to report the pod Ready again", 60)
    conditions = {c.type: c.status for c in core.read_namespaced_pod_status("marked", namespace).status.conditions}
    assert conditions == {"PodScheduled": "True", "Initialized": "True", "ContainersReady": "True", "Ready": "True"}
