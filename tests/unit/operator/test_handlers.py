"""What a reconcile pass sees of a job's children, and how it sends its writes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import kopf
import pytest

from grpojob_api.admission import parse_job
from grpojob_operator import handlers, kinds
from grpojob_operator.expectations import Expectations
from grpojob_operator.handlers import (
    JobWorker,
    WaitingForQuota,
    index_id,
    observed_from_indexes,
    reconcile,
    waits_on_the_clock,
    write_groups,
)
from grpojob_operator.kube import ApiError
from grpojob_operator.observe import Observed, OtherInfo, PodInfo
from grpojob_operator.plan import BuildError, plan, ray_cluster
from grpojob_operator.plan.actions import Create, Delete, Replace
from grpojob_operator.settings import OperatorSettings

from .conftest import children_up_to_the_head, job_body


def test_children_of_an_earlier_job_with_the_same_name_are_ignored():
    indexes = {index_id(k.kind): {} for k in kinds.WATCHED}
    indexes[index_id("Service")] = {
        ("ns", "demo", "uid-old"): [OtherInfo("demo-generation", True)],
        ("ns", "demo", "uid-new"): [OtherInfo("demo-env-math", False)],
    }
    observed = observed_from_indexes(indexes, "ns", "demo", "uid-new")
    assert observed.has("Service", "demo-env-math")
    assert not observed.has("Service", "demo-generation")


def test_independent_writes_are_grouped_and_a_config_map_or_claim_is_written_before_what_follows_it():
    def create(kind: str, name: str) -> Create:
        return Create({"kind": kind, "metadata": {"name": name}})

    first_pass = [
        create("RayCluster", "demo"),
        create("ConfigMap", "demo-config"),
        create("Service", "demo-generation"),
        create("ServiceAccount", "demo-trainer"),
        create("Role", "demo-trainer"),
    ]
    assert write_groups(first_pass) == [first_pass[:2], first_pass[2:]]
    head_ready = [create("ConfigMap", "demo-endpoints"), create("Deployment", "demo-env-a"), create("Job", "demo-t")]
    assert write_groups(head_ready) == [head_ready[:1], head_ready[1:]]
    delete = Delete("Job", "demo-trainer", "Foreground")
    retry = [Replace({"kind": "ConfigMap", "metadata": {"name": "demo-endpoints"}, "data": {}}), delete]
    assert write_groups(retry) == [retry[:1], [delete]]
    hub_model = [create("NetworkPolicy", "demo"), create("PersistentVolumeClaim", "demo-model-cache")]
    hub_model.append(create("Job", "demo-model"))
    assert write_groups(hub_model) == [hub_model[:2], hub_model[2:]]


def test_only_a_job_with_something_due_is_reconciled_again_when_nothing_changed():
    running = {"spec": {}, "status": {"phase": "Running"}}
    assert not waits_on_the_clock(running, Observed({}), Expectations())
    assert waits_on_the_clock({"spec": {"activeDeadlineSeconds": 60}, "status": {}}, Observed({}), Expectations())
    assert waits_on_the_clock({"spec": {"progressDeadlineSeconds": 60}, "status": {}}, Observed({}), Expectations())
    finished = {"spec": {"ttlSecondsAfterFinished": 5, "activeDeadlineSeconds": 60}, "status": {"phase": "Failed"}}
    assert waits_on_the_clock(finished, Observed({}), Expectations())
    assert not waits_on_the_clock(
        {"spec": {"activeDeadlineSeconds": 60}, "status": {"phase": "Succeeded"}}, Observed({}), Expectations()
    )
    expectations = Expectations()
    expectations.wrote_child("Service", "demo-env-a", None, OtherInfo("demo-env-a", False))
    assert waits_on_the_clock(running, Observed({}), expectations), "an unseen write expires"


class RefusingKube:
    """A stand-in for `Kube` whose creates the API server refuses with ``refusal`` (an ApiError), until it is None."""

    def __init__(self, refusal: ApiError | None) -> None:
        self.refusal = refusal
        self.created: list[str] = []
        self.statuses: list[dict] = []
        self.events: list[tuple[str, str, str]] = []

    def create(self, manifest: dict) -> bool:
        if self.refusal is not None:
            raise self.refusal
        self.created.append(manifest["metadata"]["name"])
        return True

    def write_status(self, namespace: str, name: str, status: dict) -> str:
        self.statuses.append(status)
        return str(len(self.statuses))

    def post_event(self, body: dict, type_: str, reason: str, message: str, now: datetime) -> None:
        self.events.append((type_, reason, message))


NOW = datetime(2026, 11, 30, 10, 0, 10, tzinfo=UTC)
QUOTA = ApiError(
    403,
    'POST /api/v1/namespaces/team-a/configmaps: {"kind":"Status","message":"configmaps \\"demo-config\\" is forbidden:'
    " exceeded quota: team-quota, requested: count/configmaps=1, used: count/configmaps=10, limited:"
    ' count/configmaps=10","reason":"Forbidden","code":403}',
)


def reconcile_once(kube: RefusingKube, status: dict | None = None) -> None:
    reconcile(job_body(status=status), Observed({}), OperatorSettings(), kube, NOW)  # type: ignore[arg-type]


def test_a_child_over_a_resource_quota_waits_with_backoff_saying_why_and_goes_on_once_the_quota_frees():
    kube = RefusingKube(QUOTA)
    with pytest.raises(WaitingForQuota):  # the job's loop backs off before the next pass
        reconcile_once(kube)
    status = kube.statuses[-1]
    assert status["phase"] == "Initializing", "not Failed: a quota frees up"
    quota = next(c for c in status["conditions"] if c["type"] == "QuotaExceeded")
    assert quota["status"] == "True" and quota["reason"] == "QuotaExceeded" and "team-quota" in quota["message"]
    assert [(t, r) for t, r, _ in kube.events] == [("Warning", "QuotaExceeded")]
    with pytest.raises(WaitingForQuota):
        reconcile_once(kube, status)
    assert len(kube.events) == 1, "one Warning while the quota stays exceeded"
    kube.refusal = None
    reconcile_once(kube, kube.statuses[-1])
    assert "demo-config" in kube.created
    quota = next(c for c in kube.statuses[-1]["conditions"] if c["type"] == "QuotaExceeded")
    assert quota["status"] == "False" and kube.statuses[-1]["phase"] == "Initializing"


def test_a_child_an_admission_webhook_refuses_still_fails_the_job():
    kube = RefusingKube(ApiError(403, 'admission webhook "policy.example.com" denied the request: no hostPath'))
    reconcile_once(kube)
    assert kube.statuses[-1]["phase"] == "Failed" and kube.statuses[-1]["reason"] == "ChildRejected"
    assert ("Warning", "PhaseFailed") in [(t, r) for t, r, _ in kube.events]


class Unbuildable:
    """A RayCluster builder that refuses every job, as a builder would refuse a spec the API admitted (an
    empty `spec.dataset.path` once did, in the trainer's); counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *args: object) -> dict:
        self.calls += 1
        raise ValueError("the RayCluster cannot be built")


def test_a_job_whose_children_cannot_be_built_fails_after_build_tries_passes_and_is_released(monkeypatch):
    monkeypatch.setattr(ray_cluster, "build_raycluster", Unbuildable())
    settings, kube = OperatorSettings(build_tries=3), RefusingKube(None)
    for tries in range(2):
        with pytest.raises(BuildError, match="stage ray_cluster: ValueError: the RayCluster cannot be built"):
            reconcile(job_body(), Observed({}), settings, kube, NOW, build_failures=tries)  # type: ignore[arg-type]
    assert kube.statuses == [] and kube.created == []
    reconcile(job_body(), Observed({}), settings, kube, NOW, build_failures=2)  # type: ignore[arg-type]
    failed = kube.statuses[-1]
    assert failed["phase"] == "Failed" and failed["reason"] == "BuildFailed"
    assert "(3 tries): stage ray_cluster: ValueError: the RayCluster cannot be built" in failed["message"]
    assert ("Warning", "PhaseFailed") in [(t, r) for t, r, _ in kube.events]
    # The next pass, of a failed job, deletes what holds GPUs and addresses, as for any failed job, without
    # building anything.
    head = PodInfo("demo-head", "ray-head", None, "Running", True, "10.0.0.2", False, NOW, None)
    children = children_up_to_the_head(parse_job(job_body()), head)
    released = plan(job_body(status=failed), Observed(children), settings, NOW)
    assert Delete("RayCluster", "demo") in released.actions
    assert released.status.phase == "Failed" and released.status.reason == "BuildFailed"


def test_the_loop_of_a_job_whose_children_cannot_be_built_fails_it_after_build_tries_passes(monkeypatch):
    builder = Unbuildable()
    monkeypatch.setattr(ray_cluster, "build_raycluster", builder)
    monkeypatch.setattr(handlers, "backoff_seconds", lambda failures: 0.0)
    kube = RefusingKube(None)

    async def until_a_status_is_written() -> None:
        leading = asyncio.Event()
        leading.set()
        memo = kopf.Memo(
            settings=OperatorSettings(build_tries=4),
            kube=kube,
            executor=None,
            write_pool=None,
            indexes={index_id(k.kind): {} for k in kinds.WATCHED},
            leading=leading,
        )
        body = job_body()
        worker = JobWorker(body["metadata"]["uid"], body)
        task = asyncio.create_task(handlers._run_worker(memo, "team-a", "demo", worker))
        async with asyncio.timeout(10):
            while not kube.statuses:
                await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(until_a_status_is_written())
    assert builder.calls == 4, "four passes, the last of which fails the job"
    assert [(s["phase"], s["reason"]) for s in kube.statuses] == [("Failed", "BuildFailed")]


def test_kopf_keeps_no_copy_of_each_object_to_diff_since_no_handler_asks_for_diffs():
    registry = kopf.OperatorRegistry()
    handlers.register(registry, OperatorSettings())
    changing = registry._changing.get_all_handlers()
    assert not list(changing), "an on.create/on.update handler needs Kopf's diff base, which NoDiffBase drops"
    kopf_settings = kopf.OperatorSettings()
    handlers.configure(kopf_settings, namespaced=False)
    body = kopf.Body({"metadata": {"name": "demo"}, "spec": {"big": list(range(100))}})
    assert kopf_settings.persistence.diffbase_storage.build(body=body) == {}
