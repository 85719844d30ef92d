"""Fixtures for the operator on the real control plane: the GRPOJob CRD, an operator process per
test (watching only that test's namespace, so it can be killed and restarted at will), and small
helpers to read and steer GRPOJobs and their pods."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from grpojob_testing.cluster import wait_until
from grpojob_trainer.net.loopback import free_port

REPO = Path(__file__).resolve().parents[3]
CRD_DIR = REPO / "charts" / "grpojob" / "crds"
GROUP, VERSION, PLURAL = "grpo.dev", "v1alpha1", "grpojobs"
UNPULLABLE_IMAGE = "registry.invalid/grpojob/unpullable:0"  # see testing/kwok/pod-stages.yaml


@pytest.fixture(scope="session")
def grpojob_crd(api_client) -> None:
    """Install (or update) the committed GRPOJob CRD and wait until it is served."""
    extensions = client.ApiextensionsV1Api(api_client)
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        try:
            current = extensions.read_custom_resource_definition(crd["metadata"]["name"])
            crd["metadata"]["resourceVersion"] = current.metadata.resource_version
            extensions.replace_custom_resource_definition(crd["metadata"]["name"], crd)
        except client.ApiException as error:
            if error.status != 404:
                raise
            extensions.create_custom_resource_definition(crd)

        def established(name: str = crd["metadata"]["name"]) -> bool:
            conditions = extensions.read_custom_resource_definition(name).status.conditions or []
            return any(c.type == "Established" and c.status == "True" for c in conditions)

        wait_until(established, f"CRD {crd['metadata']['name']} to be established", 30)


class OperatorProcess:
    """`python -m grpojob_operator` as a child process, watching one namespace."""

    def __init__(self, kubeconfig: Path, namespace: str, log_path: Path) -> None:
        self.kubeconfig, self.namespace, self.log_path = kubeconfig, namespace, log_path
        self.process: subprocess.Popen | None = None
        self.program = ["-m", "grpojob_operator"]
        """What `python` runs: the operator, or a launcher of it (see stale_cache_operator.py)."""
        self.metrics_port = 0
        self.settings = {
            "GRPOJOB_RECONCILE_INTERVAL_SECONDS": "0.5",
            "GRPOJOB_POD_FAILURE_GRACE_SECONDS": "3",
            "GRPOJOB_CLUSTER_DOMAIN": "cluster.local",
        }

    def start(self, **env: str) -> OperatorProcess:
        self.metrics_port = free_port()
        settings = {**self.settings, "GRPOJOB_METRICS_PORT": str(self.metrics_port), "GRPOJOB_PROBE_PORT": "0", **env}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, *self.program, "--namespace", self.namespace],
                env={**os.environ, "KUBECONFIG": str(self.kubeconfig), **settings},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, as when a node dies."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def wait_exit(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return response.read().decode()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def operator(
    kubeconfig: Path, api_client, namespace: str, grpojob_crd: None, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """A running operator for this test's namespace (stopped afterwards; its log in tmp_path)."""
    process = OperatorProcess(kubeconfig, namespace, tmp_path / "operator.log")
    process.start()
    yield process
    # Delete the test's jobs (no finalizer holds them: the garbage collector removes their children).
    if not process.alive():
        process.start()
    custom = client.CustomObjectsApi(api_client)
    for item in custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, item["metadata"]["name"])

    def no_jobs_left() -> bool:
        return not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]

    try:
        wait_until(no_jobs_left, "the test's GRPOJobs to be deleted", 60)
    finally:
        process.stop()


def job_manifest(name: str, **spec: Any) -> dict[str, Any]:
    """A GRPOJob that fits the fake fleet: 1 generation engine (1 GPU), 1 policy worker (2 GPUs)."""
    base: dict[str, Any] = {
        "model": {"path": "/models/tiny", "servedModelName": "tiny"},
        "dataset": {"configMap": {"name": "rows"}},
        "environments": [
            {"name": "arithmetic", "command": ["python", "-m", "grpojob_trainer.environments", "arithmetic"]}
        ],
        "generation": {"replicas": 1, "gpusPerReplica": 1},
        "training": {"replicas": 1, "gpusPerReplica": 2},
        "backoffLimit": 1,
    }
    base.update(spec)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GRPOJob", "metadata": {"name": name}, "spec": base}


class Jobs:
    """Read and steer GRPOJobs and their children in one namespace."""

    def __init__(self, api_client, namespace: str) -> None:
        self.namespace = namespace
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, manifest)

    def get(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def patch_spec(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name, {"spec": spec})

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def status(self, name: str) -> dict[str, Any]:
        return self.get(name).get("status") or {}

    def condition(self, name: str, kind: str) -> dict[str, Any] | None:
        return next((c for c in self.status(name).get("conditions", []) if c["type"] == kind), None)

    def wait_phase(self, name: str, phase: str, timeout: float = 60) -> dict[str, Any]:
        def reached() -> bool:
            return self.status(name).get("phase") == phase

        try:
            wait_until(reached, f"GRPOJob {name} to reach {phase}", timeout)
        except TimeoutError as error:
            raise TimeoutError(f"{error}; status: {self.status(name)}") from None
        return self.status(name)

    def pods(self, selector: str) -> list:
        return self.core.list_namespaced_pod(self.namespace, label_selector=selector).items

    def trainer_pods(self, name: str) -> list:
        return self.pods(f"grpo.dev/job={name},grpo.dev/component=trainer")

    def wait_trainer_pod(self, name: str, attempt: int, timeout: float = 60):
        selector = f"grpo.dev/job={name},grpo.dev/component=trainer,grpo.dev/attempt={attempt}"

        def running() -> bool:
            return any(p.status.phase == "Running" and not p.metadata.deletion_timestamp for p in self.pods(selector))

        wait_until(running, f"the trainer pod of attempt {attempt} to run", timeout)
        return next(p for p in self.pods(selector) if p.status.phase == "Running")

    def exit_pod(self, pod_name: str, code: int, message: str | None = None) -> None:
        """End a pod's containers with an exit code (and a termination message), as its process would (kwok stage
        grpojob-pod-exit)."""
        annotations = {"grpojob.dev/kwok-exit-code": str(code)}
        if message is not None:
            annotations["grpojob.dev/kwok-exit-message"] = message
        self.core.patch_namespaced_pod(pod_name, self.namespace, {"metadata": {"annotations": annotations}})

    def config_map(self, name: str) -> dict[str, str] | None:
        try:
            return self.core.read_namespaced_config_map(name, self.namespace).data or {}
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise

    def children(self, name: str) -> dict[str, list[str]]:
        """Names of every labelled child of the job, by kind."""
        selector, ns = f"grpo.dev/job={name}", self.namespace
        rayclusters = self.custom.list_namespaced_custom_object(
            "ray.io", "v1", ns, "rayclusters", label_selector=selector
        )["items"]
        listings = {
            "ConfigMap": self.core.list_namespaced_config_map,
            "Service": self.core.list_namespaced_service,
            "Deployment": self.apps.list_namespaced_deployment,
            "Job": self.batch.list_namespaced_job,
            "Pod": self.core.list_namespaced_pod,
        }
        found = {
            kind: sorted(i.metadata.name for i in list_(ns, label_selector=selector).items)
            for kind, list_ in listings.items()
        }
        return {"RayCluster": sorted(i["metadata"]["name"] for i in rayclusters), **found}

    def events(self, name: str) -> list[tuple[str, str]]:
        items = self.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={name}").items
        return [(e.reason, e.message) for e in items if e.involved_object.kind == "GRPOJob"]


@pytest.fixture
def jobs(api_client, namespace: str, fake_gpu_nodes: list[str]) -> Jobs:
    return Jobs(api_client, namespace)


def eventually(check, what: str, timeout: float = 60) -> None:
    wait_until(check, what, timeout)


def sleep_passes(passes: int = 4) -> None:
    """Give the operator a few reconcile passes (interval 0.5 s in these tests)."""
    time.sleep(0.5 * passes)
