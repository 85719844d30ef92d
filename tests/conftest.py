"""Fixtures shared by every test level.

Integration tests run against a real control plane: by default the session starts one on loopback
(`grpojob_testing.cluster`) and stops it at the end; with ``GRPOJOB_TEST_KUBECONFIG`` set they use
that cluster instead (kind, for example). Each test gets a namespace of its own.

``pytest --real-node`` starts the session's cluster with a real node (kubelet, containerd, CNI,
kube-proxy, CoreDNS; root only) and without kwok's fake nodes, for tests/e2e.

The rule that fails a setup skip in CI is the repository's (conftest.py at the root): the test tooling's
own tests (testing/tests/) keep it too.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

EXISTING_CLUSTER_ENV = "GRPOJOB_TEST_KUBECONFIG"
RAY_AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


@pytest.fixture(scope="module")
def own_ray_token() -> Iterator[str]:
    """A Ray token of the module's own, for the Ray clusters its tests start in this process (`ray.init`,
    `ray.cluster_utils.Cluster`), as `grpojob run`'s local head has one; the process's Ray settings as they were
    afterwards. Without it a cluster depends on what ran before: Ray turns token authentication on in the
    process's environment for a local cluster and reads its token from ``~/.ray/auth_token`` or caches it, so a
    later cluster's GCS could start in token mode with no token and stop at once."""
    import secrets

    from ray._private.authentication_test_utils import reset_auth_token_state

    before = {name: os.environ.get(name) for name in RAY_AUTH_VARIABLES}
    token = secrets.token_hex(32)
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    os.environ |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    reset_auth_token_state()
    try:
        yield token
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        reset_auth_token_state()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--real-node",
        action="store_true",
        help="start the session cluster with a real node and no fake nodes (root; for tests/e2e)",
    )


@pytest.fixture(scope="session")
def kubeconfig(request: pytest.FixtureRequest) -> Iterator[Path]:
    """Admin kubeconfig of the cluster the integration tests run against."""
    existing = os.environ.get(EXISTING_CLUSTER_ENV)
    if existing:
        yield Path(existing)
        return
    from grpojob_testing.cluster import Cluster, clusters_root

    cluster = Cluster(clusters_root() / f"pytest-{os.getpid()}")
    if request.config.getoption("--real-node"):
        cluster.up(cpu_nodes=0, gpu_nodes=0, real_node=True)
    else:
        cluster.up()
    try:
        yield cluster.kubeconfig
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def api_client(kubeconfig: Path):
    """A Kubernetes API client for the test cluster."""
    from kubernetes import config

    client = config.new_client_from_config(str(kubeconfig))
    yield client
    client.close()


@pytest.fixture(scope="session")
def fake_gpu_nodes(api_client) -> list[str]:
    """The kwok-managed GPU nodes the operator tests schedule onto and steer pods on (through the pod
    stages of testing/kwok/pod-stages.yaml). A cluster without them (plain kind) skips those tests."""
    from kubernetes import client

    from grpojob_testing.nodes import GPU_RESOURCE, KWOK_ANNOTATION

    nodes = [
        n.metadata.name
        for n in client.CoreV1Api(api_client).list_node().items
        if (n.metadata.annotations or {}).get(KWOK_ANNOTATION) and GPU_RESOURCE in (n.status.capacity or {})
    ]
    if not nodes:
        pytest.skip("the cluster has no kwok-managed GPU nodes (kwok.x-k8s.io/node=fake with nvidia.com/gpu)")
    return nodes


@pytest.fixture
def namespace(api_client, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test (with its default ServiceAccount), deleted afterwards."""
    from kubernetes import client

    from grpojob_testing.cluster import wait_until

    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{slug}-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api_client)
    core.create_namespace({"metadata": {"name": name, "labels": {"grpojob.dev/test": "true"}}})

    def has_default_service_account() -> bool:
        return any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(name).items)

    wait_until(has_default_service_account, f"the default ServiceAccount in {name}", 60)
    yield name
    core.delete_namespace(name)
