"""Fixtures for the Helm chart on the real control plane: the pinned helm and kubectl, a release per
test (uninstalled afterwards, since its ClusterRoles outlive the test's namespace), and a kubeconfig
that authenticates as the chart's ServiceAccount with a token from the TokenRequest API."""

from __future__ import annotations

import base64
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from grpojob_testing import build
from tests.integration.operator.conftest import grpojob_crd  # noqa: F401 (the GRPOJob CRD fixture)

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "grpojob"


def _tool(component: str, program: str) -> Path:
    path = build.build(build.load_components()[component]) / program
    assert path.is_file(), f"{program} was not built at {path}"
    return path


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    return _tool("helm", "helm")


@pytest.fixture(scope="session")
def kubectl_bin() -> Path:
    return _tool("kubernetes", "kubectl")


class Helm:
    """The pinned helm against the test cluster, with its state kept out of the user's home."""

    def __init__(self, binary: Path, kubeconfig: Path, home: Path) -> None:
        self.binary, self.kubeconfig, self.home = binary, kubeconfig, home

    def __call__(self, *args: str, stdin: str | None = None, timeout: float = 180) -> str:
        env = {
            "KUBECONFIG": str(self.kubeconfig),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
            "HOME": str(self.home),  # the kube client's discovery cache goes to $HOME/.kube
            "PATH": "/usr/bin:/bin",
        }
        result = subprocess.run(
            [str(self.binary), *args], input=stdin, capture_output=True, text=True, env=env, timeout=timeout
        )
        if result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result.stdout


@pytest.fixture
def helm(helm_bin: Path, kubeconfig: Path, tmp_path: Path) -> Helm:
    return Helm(helm_bin, kubeconfig, tmp_path / "helm")


class Release:
    """One `helm install` of charts/grpojob into a namespace; `uninstall` is idempotent."""

    def __init__(self, helm: Helm, name: str, namespace: str) -> None:
        self.helm, self.name, self.namespace = helm, name, namespace
        self.installed = False

    @property
    def fullname(self) -> str:
        return f"{self.name}-grpojob"

    @property
    def cluster_name(self) -> str:
        """Name of the release's ClusterRole and ClusterRoleBinding (see _helpers.tpl)."""
        return f"{self.fullname}-{self.namespace}"[:58].rstrip("-")

    def install(self, *flags: str) -> str:
        out = self.helm("install", self.name, str(CHART), "--namespace", self.namespace, *flags)
        self.installed = True
        return out

    def upgrade(self, *flags: str) -> str:
        return self.helm("upgrade", self.name, str(CHART), "--namespace", self.namespace, *flags)

    def uninstall(self) -> str:
        if not self.installed:
            return ""
        self.installed = False
        return self.helm("uninstall", self.name, "--namespace", self.namespace, "--wait", "--timeout", "60s")


@pytest.fixture
def release(helm: Helm, namespace: str) -> Iterator[Release]:
    """A release name unique to this test, in the test's namespace; uninstalled afterwards."""
    installed = Release(helm, f"op-{uuid.uuid4().hex[:6]}", namespace)
    yield installed
    installed.uninstall()


def service_account_kubeconfig(
    api_client, admin_kubeconfig: Path, namespace: str, service_account: str, path: Path
) -> Path:
    """Write a kubeconfig that authenticates as `namespace/service_account` with a bearer token from
    the TokenRequest API (what the kubelet mounts into the operator's pod), for the admin kubeconfig's
    server and CA."""
    request = client.CoreV1Api(api_client).create_namespaced_service_account_token(
        service_account, namespace, {"spec": {"expirationSeconds": 3600}}
    )
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])["cluster"]
    ca_data = cluster.get("certificate-authority-data")
    if ca_data is None:
        ca_path = Path(cluster["certificate-authority"])
        if not ca_path.is_absolute():
            ca_path = admin_kubeconfig.parent / ca_path
        ca_data = base64.b64encode(ca_path.read_bytes()).decode()
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": cluster["server"], "certificate-authority-data": ca_data}}],
        "users": [{"name": service_account, "user": {"token": request.status.token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "test", "user": service_account, "namespace": namespace}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def can_i(sa_api_client, verb: str, resource: str, namespace: str = "", group: str = "", subresource: str = "") -> bool:
    """SelfSubjectAccessReview, asked with the ServiceAccount's own token."""
    review = client.AuthorizationV1Api(sa_api_client).create_self_subject_access_review(
        {
            "spec": {
                "resourceAttributes": {
                    "verb": verb,
                    "resource": resource,
                    "group": group,
                    "namespace": namespace,
                    "subresource": subresource,
                }
            }
        }
    )
    return bool(review.status.allowed)
