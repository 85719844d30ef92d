"""Fixtures of the end-to-end suite: it needs a node that really runs pods. Start one with
``pytest --real-node tests/e2e`` (root), or point ``GRPOJOB_TEST_KUBECONFIG`` at a kind cluster."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client

from grpojob_testing.nodes import KWOK_ANNOTATION


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
