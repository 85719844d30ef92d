"""Kueue admits a GRPOJob as a whole, on the real control plane with Kueue v0.17.0, a real ClusterQueue,
LocalQueue and ResourceFlavors, and kwok's GPU nodes: a job waits Queued (saying why) while the quota is
taken and starts when it frees, two jobs that together exceed the quota run one after the other, and a
higher-priority job preempts a lower one, which is suspended (Queued, no pods) and later resumes."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from grpojob_testing import build
from tests.conftest import EXISTING_CLUSTER_ENV

from .conftest import eventually, job_manifest

pytestmark = pytest.mark.integration

KUEUE = ("kueue.x-k8s.io", "v1beta2")
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
FLAVOR_TOLERATION = {"key": "grpo.dev/kueue-test", "operator": "Exists", "effect": "NoSchedule"}
GPUS_PER_JOB = 3  # job_manifest: 1 generation GPU + 2 policy GPUs


class Queue:
    """One test's Kueue objects: ResourceFlavors for CPU and GPU, a ClusterQueue with 4 GPUs that preempts
    lower priorities, the LocalQueue `team` in the test's namespace, and two WorkloadPriorityClasses."""

    def __init__(self, api_client, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.cpu_flavor, self.gpu_flavor = f"{namespace}-cpu", f"{namespace}-gpu"
        self.cluster_queue, self.local_queue = namespace, "team"
        self.low, self.high = f"{namespace}-low", f"{namespace}-high"

    def create(self) -> None:
        gpu_flavor_spec = {"nodeLabels": {GPU_PRODUCT_LABEL: "NVIDIA-H200"}, "tolerations": [FLAVOR_TOLERATION]}
        for name, spec in ((self.cpu_flavor, {}), (self.gpu_flavor, gpu_flavor_spec)):
            self._create_cluster(
                "resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": name}, "spec": spec}
            )
        for name, value in ((self.low, 10), (self.high, 1000)):
            body = {"kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value}
            self._create_cluster("workloadpriorityclasses", body)
        cpu = {"name": "cpu", "nominalQuota": "1000"}
        memory = {"name": "memory", "nominalQuota": "10Ti"}
        gpu = {"name": "nvidia.com/gpu", "nominalQuota": 4}
        spec = {
            "namespaceSelector": {},
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory"],
                    "flavors": [{"name": self.cpu_flavor, "resources": [cpu, memory]}],
                },
                {"coveredResources": ["nvidia.com/gpu"], "flavors": [{"name": self.gpu_flavor, "resources": [gpu]}]},
            ],
        }
        self._create_cluster(
            "clusterqueues", {"kind": "ClusterQueue", "metadata": {"name": self.cluster_queue}, "spec": spec}
        )
        local = {
            "apiVersion": "/".join(KUEUE),
            "kind": "LocalQueue",
            "metadata": {"name": self.local_queue},
            "spec": {"clusterQueue": self.cluster_queue},
        }
        self.custom.create_namespaced_custom_object(*KUEUE, self.namespace, "localqueues", local)

    def delete(self) -> None:
        for plural, name in (
            ("clusterqueues", self.cluster_queue),
            ("resourceflavors", self.cpu_flavor),
            ("resourceflavors", self.gpu_flavor),
            ("workloadpriorityclasses", self.low),
            ("workloadpriorityclasses", self.high),
        ):
            try:
                self.custom.delete_cluster_custom_object(*KUEUE, plural, name)
            except client.ApiException as error:
                if error.status != 404:
                    raise

    def _create_cluster(self, plural: str, body: dict[str, Any]) -> None:
        self.custom.create_cluster_custom_object(*KUEUE, plural, {"apiVersion": "/".join(KUEUE), **body})

    def workloads(self) -> list[dict[str, Any]]:
        return self.custom.list_namespaced_custom_object(*KUEUE, self.namespace, "workloads")["items"]

    def job(self, name: str, priority: str | None = None) -> dict[str, Any]:
        manifest = job_manifest(name)
        labels = {QUEUE_NAME_LABEL: self.local_queue}
        if priority:
            labels[PRIORITY_CLASS_LABEL] = priority
        manifest["metadata"]["labels"] = labels
        return manifest


@pytest.fixture
def queue(api_client, namespace: str) -> Iterator[Queue]:
    extensions = client.ApiextensionsV1Api(api_client)
    try:
        extensions.read_custom_resource_definition("workloads.kueue.x-k8s.io")
    except client.ApiException as error:
        if error.status != 404:
            raise
        if os.environ.get(EXISTING_CLUSTER_ENV):
            pytest.skip(f"the cluster of {EXISTING_CLUSTER_ENV} has no Kueue")
        pytest.skip("the test cluster runs without Kueue: it could not be built here (make cluster-binaries)")
    made = Queue(api_client, namespace)
    made.create()
    yield made
    made.delete()


def kubectl_get_grpojobs(kubeconfig: Path, namespace: str) -> str:
    kubectl = build.load_components()["kubernetes"].bin_dir / "kubectl"
    return subprocess.run(
        [str(kubectl), f"--kubeconfig={kubeconfig}", "-n", namespace, "get", "grpojobs"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def phase_in_kubectl(kubeconfig: Path, namespace: str, job: str) -> str:
    for line in kubectl_get_grpojobs(kubeconfig, namespace).splitlines():
        if line.split()[0] == job:
            return line
    raise AssertionError(f"{job} is not listed by kubectl get grpojobs")


def finish(jobs, name: str) -> None:
    """The job's trainer exits 0: the job succeeds, and Kueue frees its quota."""
    pod = next(p for p in jobs.trainer_pods(name) if p.status.phase == "Running")
    jobs.exit_pod(pod.metadata.name, 0)
    jobs.wait_phase(name, "Succeeded")


def test_jobs_over_the_quota_wait_queued_saying_why_and_run_one_after_the_other(
    operator, jobs, queue: Queue, kubeconfig: Path
):
    jobs.create(queue.job("first"))
    jobs.wait_phase("first", "Running", timeout=90)
    # One Workload per job, covering every pod; the queue-name label is on no child (no double admission).
    (workload,) = queue.workloads()
    assert workload["metadata"]["ownerReferences"][0]["name"] == "first"
    pod_sets = {p["name"]: p["count"] for p in workload["spec"]["podSets"]}
    assert pod_sets == {"head": 1, "generation": 1, "policy": 1, "env-arithmetic": 1, "trainer": 1}
    for kind, children in jobs.children("first").items():
        assert children, kind
    for pod in jobs.pods("grpo.dev/job=first"):
        assert QUEUE_NAME_LABEL not in (pod.metadata.labels or {}), pod.metadata.name
    ray_cluster = jobs.custom.get_namespaced_custom_object("ray.io", "v1", jobs.namespace, "rayclusters", "first")
    assert QUEUE_NAME_LABEL not in ray_cluster["metadata"]["labels"]
    # The GPU pod sets were admitted on the GPU flavor: its node labels and toleration are on their pods.
    (policy,) = jobs.pods("ray.io/cluster=first,ray.io/group=policy")
    assert policy.spec.node_selector[GPU_PRODUCT_LABEL] == "NVIDIA-H200"
    assert any(t.key == FLAVOR_TOLERATION["key"] for t in policy.spec.tolerations)
    (head,) = jobs.pods("ray.io/cluster=first,ray.io/node-type=head")
    assert GPU_PRODUCT_LABEL not in (head.spec.node_selector or {})

    jobs.create(queue.job("second"))
    jobs.wait_phase("second", "Queued")

    def says_why() -> bool:
        admitted = jobs.condition("second", "Admitted") or {}
        return admitted.get("status") == "False" and "insufficient" in admitted.get("message", "")

    eventually(says_why, "the second job's Admitted condition to name the missing quota", 60)
    print(f"second job waiting: {jobs.condition('second', 'Admitted')['message']}")
    assert not any(jobs.children("second")[kind] for kind in ("RayCluster", "Pod", "Job", "Deployment"))
    assert "Queued" in phase_in_kubectl(kubeconfig, jobs.namespace, "second")
    print(kubectl_get_grpojobs(kubeconfig, jobs.namespace))

    finish(jobs, "first")
    jobs.wait_phase("second", "Running", timeout=90)
    assert "Running" in phase_in_kubectl(kubeconfig, jobs.namespace, "second")
    print(kubectl_get_grpojobs(kubeconfig, jobs.namespace))


def test_a_higher_priority_job_preempts_a_lower_one_which_is_queued_then_resumes(operator, jobs, queue: Queue):
    jobs.create(queue.job("low", priority=queue.low))
    jobs.wait_phase("low", "Running", timeout=90)
    jobs.create(queue.job("high", priority=queue.high))

    status = jobs.wait_phase("low", "Queued", timeout=90)
    admitted = jobs.condition("low", "Admitted")
    assert admitted["status"] == "False" and "evicted by Kueue" in admitted["message"], admitted
    print(f"low job preempted: {admitted['reason']}: {admitted['message']}")
    eventually(lambda: not jobs.children("low")["Pod"], "the preempted job's pods to go", 60)
    jobs.wait_phase("high", "Running", timeout=90)
    assert jobs.status("low")["phase"] == "Queued"

    finish(jobs, "high")
    resumed = jobs.wait_phase("low", "Running", timeout=90)
    assert resumed["attempt"] == status["attempt"] == 1, "a preemption is not a failed attempt"
    assert (jobs.condition("low", "Admitted") or {}).get("status") == "True"
    assert any(reason == "PhaseQueued" for reason, _ in jobs.events("low"))


def test_a_suspended_job_frees_its_quota_for_the_next_and_queues_again_when_resumed(operator, jobs, queue: Queue):
    jobs.create(queue.job("paused"))
    jobs.wait_phase("paused", "Running", timeout=90)
    jobs.create(queue.job("waiting"))
    jobs.wait_phase("waiting", "Queued")

    jobs.patch_spec("paused", {"suspend": True})
    jobs.wait_phase("paused", "Suspended")
    jobs.wait_phase("waiting", "Running", timeout=90)  # the suspended job's quota went with its Workload

    jobs.patch_spec("paused", {"suspend": False})
    jobs.wait_phase("paused", "Queued", timeout=60)
    finish(jobs, "waiting")
    jobs.wait_phase("paused", "Running", timeout=90)
    assert [w["metadata"]["ownerReferences"][0]["name"] for w in queue.workloads()].count("paused") == 1
