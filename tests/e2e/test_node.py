"""The real node runs pods: from an image imported into its container runtime, with the exit code
of their process, and with cluster networking (Services through kube-proxy, names through DNS)."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from grpojob_testing.cluster import wait_until
from grpojob_testing.node_images import PROBE_IMAGE
from tests.e2e.conftest import wait_for_pod

pytestmark = pytest.mark.e2e


def probe_pod(name: str, node: str, args: list[str], labels: dict[str, str] | None = None) -> dict:
    """A pod running grpojob-probe with ``args`` on ``node``, never restarted."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "probe", "image": PROBE_IMAGE, "imagePullPolicy": "IfNotPresent", "args": args}],
        },
    }


def ready_endpoints(api_client, namespace: str, service: str) -> list[str]:
    """The addresses of ``service``'s ready endpoints, from its EndpointSlices (what kube-proxy reads)."""
    slices = client.DiscoveryV1Api(api_client).list_namespaced_endpoint_slice(
        namespace, label_selector=f"kubernetes.io/service-name={service}"
    )
    return [
        address
        for endpoint_slice in slices.items
        for endpoint in endpoint_slice.endpoints or []
        if endpoint.conditions and endpoint.conditions.ready
        for address in endpoint.addresses
    ]


def run_probe(core, namespace: str, node: str, name: str, args: list[str], timeout: float = 60) -> tuple[object, str]:
    """Run a probe pod to its end and return it with its log; run it again (``name-2``, ...) while it fails at
    HTTP, for up to ``timeout`` seconds. A new Service's EndpointSlice lists its ready pod a moment before
    kube-proxy has written the Service's rules, and until then its cluster IP, reused from a deleted Service,
    may still lead to that Service's pods, which answer 404."""
    deadline = time.monotonic() + timeout
    attempt = 1
    while True:
        pod_name = name if attempt == 1 else f"{name}-{attempt}"
        core.create_namespaced_pod(namespace, probe_pod(pod_name, node, args))
        finished = wait_for_pod(core, namespace, pod_name, {"Succeeded", "Failed"}, 60)
        log = core.read_namespaced_pod_log(pod_name, namespace)
        if finished.status.phase == "Succeeded" or "answered" not in log or time.monotonic() > deadline:
            return finished, log
        attempt += 1
        time.sleep(1)


def exit_code(pod) -> int:
    return pod.status.container_statuses[0].state.terminated.exit_code


def test_a_pod_from_a_locally_imported_image_exits_with_its_code(api_client, real_node, namespace):
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, probe_pod("succeeds", real_node, ["exit", "0"]))
    core.create_namespaced_pod(namespace, probe_pod("fails", real_node, ["exit", "3"]))

    succeeded = wait_for_pod(core, namespace, "succeeds", {"Succeeded", "Failed"}, 60)
    failed = wait_for_pod(core, namespace, "fails", {"Succeeded", "Failed"}, 60)

    assert (succeeded.status.phase, exit_code(succeeded)) == ("Succeeded", 0)
    assert (failed.status.phase, exit_code(failed)) == ("Failed", 3)
    assert succeeded.status.pod_ip and succeeded.status.pod_ip != failed.status.pod_ip


def test_a_pod_resolves_a_service_name_and_reaches_the_pod_behind_it(api_client, real_node, namespace):
    core = client.CoreV1Api(api_client)
    server = probe_pod("web", real_node, ["serve", ":8080", "hello from web"], labels={"app": "web"})
    server["spec"]["restartPolicy"] = "Always"
    server["spec"]["containers"][0]["readinessProbe"] = {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}
    core.create_namespaced_pod(namespace, server)
    service = core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    wait_until(
        lambda: (
            core.read_namespaced_pod("web", namespace).status.pod_ip is not None
            and all(c.ready for c in core.read_namespaced_pod("web", namespace).status.container_statuses or [False])
        ),
        "the web pod to be ready",
        60,
    )
    wait_until(lambda: ready_endpoints(api_client, namespace, "web"), "the web Service to list its ready pod", 60)
    name = f"web.{namespace}.svc.cluster.local"

    logs = {}
    for pod, args in (
        ("lookup", ["lookup", name]),
        ("get", ["get", f"http://{name}/"]),
        ("get-short", ["get", "http://web/"]),
    ):
        finished, logs[pod] = run_probe(core, namespace, real_node, pod, args)
        assert finished.status.phase == "Succeeded", f"{pod}: {logs[pod]}"
    assert logs["lookup"].split() == [service.spec.cluster_ip]
    assert logs["get"].strip() == "hello from web"
    assert logs["get-short"].strip() == "hello from web"
