"""Kueue admission of a whole GRPOJob, without a cluster: the Workload's pod sets cover every pod, no child
is planned before admission, the admitted flavors place the children, an eviction removes them and hands
the Workload back, and the queue-name label is never copied onto a child."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from grpojob_api import v1alpha1 as api
from grpojob_api.admission import parse_job
from grpojob_api.v1alpha1 import Phase
from grpojob_operator import kueue, names
from grpojob_operator.children.model import build_model_download_job
from grpojob_operator.children.raycluster import build_raycluster
from grpojob_operator.children.tensorboard import build_tensorboard_deployment
from grpojob_operator.observe import KueueContext, Observed, summarize
from grpojob_operator.plan import plan as plan_job
from grpojob_operator.plan.actions import Create, Delete, Patch
from grpojob_operator.plan.conditions import condition
from grpojob_operator.settings import OperatorSettings

from .conftest import job_body

SETTINGS = OperatorSettings()
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
LABELS = {names.QUEUE_NAME_LABEL: "team", names.PRIORITY_CLASS_LABEL: "high"}


def labelled_body(**status: Any) -> dict[str, Any]:
    body = job_body(status=status or None)
    body["metadata"]["labels"] = dict(LABELS)
    return body


def workload_body(conditions: list[dict[str, Any]], admission: dict[str, Any] | None = None) -> dict[str, Any]:
    stamped = [{"lastTransitionTime": "2026-12-01T11:00:00Z", "reason": "R", "message": "", **c} for c in conditions]
    return {"metadata": {"name": "demo-workload"}, "status": {"conditions": stamped, "admission": admission}}


ADMISSION = {
    "clusterQueue": "gpus",
    "podSetAssignments": [
        {"name": "generation", "flavors": {"cpu": "cpu", "memory": "cpu", "nvidia.com/gpu": "h200"}},
        {"name": "policy", "flavors": {"cpu": "cpu", "nvidia.com/gpu": "h200"}},
        {"name": "trainer", "flavors": {"cpu": "cpu", "memory": "cpu"}},
    ],
}
H200 = {"nodeLabels": {"pool": "h200"}, "tolerations": [{"key": "pool", "operator": "Exists", "effect": "NoSchedule"}]}


def observed_with(workload: dict[str, Any] | None, **kueue_context: Any) -> Observed:
    children = {"Workload": {"demo-workload": summarize("Workload", workload)}} if workload else {}
    return Observed(children, KueueContext(**kueue_context))


def test_the_workload_covers_every_pod_of_the_job_with_its_priority():
    job = parse_job(labelled_body())
    workload = kueue.build_workload(job, SETTINGS, 1000)
    assert workload["metadata"]["name"] == "demo-workload"
    assert workload["metadata"]["ownerReferences"][0]["name"] == "demo"
    assert names.QUEUE_NAME_LABEL not in workload["metadata"]["labels"]
    spec = workload["spec"]
    assert spec["queueName"] == "team"
    assert spec["priorityClassRef"] == {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "high"}
    assert spec["priority"] == 1000
    sets = {s["name"]: s for s in spec["podSets"]}
    assert {name: s["count"] for name, s in sets.items()} == {
        "head": 1,
        "generation": 2,
        "policy": 1,
        "env-math": 1,
        "trainer": 1,
    }
    gpus = {
        n: s["template"]["spec"]["containers"][0]["resources"]["requests"].get("nvidia.com/gpu")
        for n, s in sets.items()
    }
    assert gpus == {"head": None, "generation": "1", "policy": "4", "env-math": None, "trainer": None}


def test_nothing_but_the_workload_is_created_until_kueue_admits_it():
    plan = plan_job(labelled_body(), observed_with(None, priority=1000), SETTINGS, NOW)
    assert [a.manifest["kind"] for a in plan.actions] == ["Workload"]  # type: ignore[union-attr]
    assert plan.status.phase == Phase.QUEUED
    waiting = workload_body(
        [{"type": "QuotaReserved", "status": "False", "message": "insufficient quota for nvidia.com/gpu"}]
    )
    plan = plan_job(labelled_body(phase="Queued"), observed_with(waiting), SETTINGS, NOW)
    assert plan.actions == [] and plan.status.phase == Phase.QUEUED
    admitted = condition(plan.status, api.ConditionType.ADMITTED)
    assert admitted is not None and admitted.status == "False" and "insufficient quota" in admitted.message


def test_a_missing_priority_class_is_said_and_nothing_is_created():
    plan = plan_job(
        labelled_body(), observed_with(None, problem="WorkloadPriorityClass high does not exist"), SETTINGS, NOW
    )
    assert plan.actions == [] and plan.status.phase == Phase.QUEUED
    assert "high does not exist" in plan.status.message


def test_an_admitted_job_starts_its_children_on_the_admitted_flavors_without_the_queue_label():
    workload = workload_body(
        [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}], ADMISSION
    )
    plan = plan_job(
        labelled_body(phase="Queued"), observed_with(workload, flavors={"h200": H200, "cpu": {}}), SETTINGS, NOW
    )
    created = {a.manifest["kind"]: a.manifest for a in plan.actions if isinstance(a, Create)}
    cluster = created["RayCluster"]
    groups = {g["groupName"]: g["template"]["spec"] for g in cluster["spec"]["workerGroupSpecs"]}
    for group in ("generation", "policy"):
        assert groups[group]["nodeSelector"]["pool"] == "h200"
        assert H200["tolerations"][0] in groups[group]["tolerations"]
    assert "pool" not in (cluster["spec"]["headGroupSpec"]["template"]["spec"].get("nodeSelector") or {})
    assert names.QUEUE_NAME_LABEL not in json.dumps([a.manifest for a in plan.actions if isinstance(a, Create)])
    admitted = condition(plan.status, api.ConditionType.ADMITTED)
    assert admitted is not None and admitted.status == "True"


def test_an_evicted_job_loses_its_children_then_hands_its_workload_back_and_waits():
    evicted = workload_body(
        [
            {"type": "QuotaReserved", "status": "True"},
            {"type": "Admitted", "status": "True"},
            {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "to admit a higher priority"},
        ],
        ADMISSION,
    )
    observed = observed_with(evicted)
    observed.children["RayCluster"] = {"demo": summarize("RayCluster", {"metadata": {"name": "demo"}})}
    observed.children["Pod"] = {"demo-head": summarize("Pod", {"metadata": {"name": "demo-head"}})}
    plan = plan_job(labelled_body(phase="Running", attempt=1), observed, SETTINGS, NOW)
    assert [(a.kind, a.name) for a in plan.actions if isinstance(a, Delete)] == [("RayCluster", "demo")]
    assert not [a for a in plan.actions if isinstance(a, Patch)], "the Workload waits for the pods to go"
    assert plan.status.phase == Phase.QUEUED and plan.status.reason == "Preempted"
    assert [e.reason for e in plan.events] == ["PhaseQueued"]

    (patch,) = plan_job(labelled_body(phase="Queued", attempt=1), observed_with(evicted), SETTINGS, NOW).actions
    assert isinstance(patch, Patch) and patch.subresource == "status"
    assert patch.patch["status"]["admission"] is None
    conditions = {c["type"]: (c["status"], c["reason"]) for c in patch.patch["status"]["conditions"]}
    assert conditions["QuotaReserved"] == ("False", "Pending") and conditions["Requeued"] == ("True", "Preempted")


def test_a_finished_job_marks_its_workload_finished_so_kueue_frees_the_quota():
    admitted = workload_body(
        [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}], ADMISSION
    )
    body = labelled_body(phase="Succeeded", attempt=1, message="the trainer finished (attempt 1)")
    (patch,) = [a for a in plan_job(body, observed_with(admitted), SETTINGS, NOW).actions if isinstance(a, Patch)]
    finished = next(c for c in patch.patch["status"]["conditions"] if c["type"] == "Finished")
    assert (finished["status"], finished["reason"]) == ("True", "Succeeded")


def test_an_unlabelled_job_has_no_workload():
    plan = plan_job(job_body(), Observed(), SETTINGS, NOW)
    assert "Workload" not in [a.manifest["kind"] for a in plan.actions if isinstance(a, Create)]
    assert plan.status.phase != Phase.QUEUED
    assert build_raycluster(parse_job(job_body()), SETTINGS)["kind"] == "RayCluster"


def test_a_suspended_job_gives_its_workload_up_and_queues_anew_when_resumed():
    admitted = workload_body(
        [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}], ADMISSION
    )
    body = labelled_body(phase="Running", attempt=1)
    body["spec"]["suspend"] = True
    plan = plan_job(body, observed_with(admitted), SETTINGS, NOW)
    assert ("Workload", "demo-workload") in [(a.kind, a.name) for a in plan.actions if isinstance(a, Delete)]
    assert plan.status.phase == Phase.SUSPENDED


HUB_MODEL = {"id": "Qwen/Qwen2.5-0.5B", "servedModelName": "policy"}
TRAINER_RULE = {"nodeSelector": {"pool": "cpu"}, "tolerations": [{"key": "cpu", "operator": "Exists"}]}


def hub_body(tensorboard: bool = False) -> dict[str, Any]:
    """A labelled job of a hub model, TensorBoard on or off, whose trainer has a scheduling rule."""
    body = labelled_body()
    body["spec"]["model"] = dict(HUB_MODEL)
    body["spec"]["scheduling"] = {"trainer": TRAINER_RULE}
    if tensorboard:
        body["spec"]["logging"] = {"tensorboard": True}
        body["spec"]["checkpointing"] = {"pvc": {"claimName": "data"}}
    return body


def test_a_hub_model_job_gets_a_workload_before_its_model_is_downloaded():
    # The trainer's pod set needs its requests and scheduling, not the commit the download resolves later.
    workload = kueue.build_workload(parse_job(hub_body()), SETTINGS, 1000)
    assert "trainer" in {s["name"] for s in workload["spec"]["podSets"]}


def test_the_model_download_and_tensorboard_are_pod_sets_placed_as_the_trainer():
    sets = {s["name"]: s for s in kueue.pod_sets(parse_job(hub_body(tensorboard=True)), SETTINGS)}
    assert sets["model-download"]["count"] == sets["tensorboard"]["count"] == 1
    for name in ("model-download", "tensorboard", "trainer"):
        spec = sets[name]["template"]["spec"]
        assert spec["nodeSelector"] == {"pool": "cpu"}, name
        assert spec["tolerations"] == [{"key": "cpu", "operator": "Exists"}], name
    assert sets["model-download"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"


def test_only_a_hub_model_is_downloaded_and_only_tensorboard_watches_the_logs():
    assert {"model-download", "tensorboard"}.isdisjoint(
        s["name"] for s in kueue.pod_sets(parse_job(labelled_body()), SETTINGS)
    )


def test_the_admitted_flavors_place_the_model_download_and_tensorboard():
    job = parse_job(hub_body(tensorboard=True))
    place = kueue.placer({"model-download": ({"pool": "h200"}, []), "tensorboard": ({"pool": "cpu-b"}, [])})
    download = place(build_model_download_job(job, SETTINGS))["spec"]["template"]["spec"]
    tensorboard = place(build_tensorboard_deployment(job, SETTINGS))["spec"]["template"]["spec"]
    assert download["nodeSelector"] == {"pool": "h200"}
    assert tensorboard["nodeSelector"] == {"pool": "cpu-b"}
