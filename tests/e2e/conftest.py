"""Fixtures of the end-to-end suite: it needs a node that really runs pods. Start one with
``pytest --real-node tests/e2e`` (root), or point ``GRPOJOB_TEST_KUBECONFIG`` at a kind cluster."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from grpojob_testing.nodes import KWOK_ANNOTATION
from tests.e2e import cluster_setup


@pytest.fixture(scope="session")
def real_node(api_client) -> str:
    """Name of a Ready node that is not kwok's; the suite skips on a cluster without one."""
    for item in client.CoreV1Api(api_client).list_node().items:
        ready = any(c.type == "Ready" and c.status == "True" for c in item.status.conditions or [])
        if ready and KWOK_ANNOTATION not in (item.metadata.annotations or {}):
            return item.metadata.name
    pytest.skip("the cluster has no real Ready node (run `pytest --real-node tests/e2e`, or use kind)")


def wait_for_pod(core: client.CoreV1Api, namespace: str, name: str, phases: set[str], timeout: float) -> Any:
    """Poll a pod until its phase is one of ``phases``; fail with its status after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        pod = core.read_namespaced_pod(name, namespace)
        if pod.status.phase in phases:
            return pod
        if time.monotonic() > deadline:
            pytest.fail(f"pod {namespace}/{name} is {pod.status.phase}, not {sorted(phases)}: {pod.status}")
        time.sleep(0.5)


@pytest.fixture(scope="session")
def operator_release(kubeconfig: Path, api_client, real_node: str) -> Iterator[str]:
    """Our images on the node, small requests where the API allows, and the chart installed: the
    operator runs as a pod. Yields the operator's namespace."""
    paths = cluster_setup.real_node_paths(kubeconfig)
    if paths is not None:
        cluster_setup.load_images(paths)
    cluster_setup.apply_small_requests_policy(api_client)
    namespace = f"grpojob-e2e-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(api_client).create_namespace(
        {"metadata": {"name": namespace, "labels": cluster_setup.TEST_NAMESPACE_LABEL}}
    )
    cluster_setup.helm_install(kubeconfig, namespace, "grpojob")
    yield namespace
    cluster_setup.helm_uninstall(kubeconfig, namespace, "grpojob")
    client.CoreV1Api(api_client).delete_namespace(namespace)


@pytest.fixture
def grpo_data(api_client, namespace: str, operator_release: str) -> Iterator[str]:
    """The claim ``grpo-data`` in the test's namespace, holding ``tiny-model/`` and ``train.jsonl``."""
    host_dir = cluster_setup.create_data_claim(api_client, namespace)
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, cluster_setup.write_model_and_dataset_pod(rows=256))
    pod = wait_for_pod(core, namespace, "write-model", {"Succeeded", "Failed"}, 300)
    assert pod.status.phase == "Succeeded", core.read_namespaced_pod_log("write-model", namespace)
    yield cluster_setup.DATA_CLAIM
    cluster_setup.delete_data_volume(api_client, namespace, host_dir)
