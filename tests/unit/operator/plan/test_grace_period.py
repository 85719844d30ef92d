"""The trainer pod's grace period against what a stop needs: the trainer's measure reaches the status, a retry's pod
gets a grace period that fits it unless the user set one, and a grace period set too short is reported."""

from __future__ import annotations

from grpojob_api import v1alpha1 as api
from grpojob_operator.observe import TrainerJobInfo
from grpojob_operator.plan.conditions import condition

from ..conftest import job_body
from .conftest import base_children, pod, run, running_attempt, with_endpoints, with_report

STOP_REPORT = {
    "stopSeconds": "185",
    "checkpointWriteSeconds": "48.2",
    "trainingSeconds": "21.5",
    "checkpointBytes": "14920384512",
}
"""What the trainer reports once it has written a checkpoint (`grpojob_api.progress.stop_data`)."""
MEASURED = {"stopSeconds": 185, "writeSeconds": 48.2, "trainingSeconds": 21.5, "bytes": 14920384512}


def with_grace_period(seconds: int | None, **status) -> dict:
    body = job_body(status=status or None)
    if seconds is not None:
        body["spec"]["checkpointing"] = {"gracePeriodSeconds": seconds}
    return body


def next_trainer_pod(body: dict) -> dict:
    """The pod of the trainer Job the plan creates for the job's attempt (its previous one gone)."""
    plan = run(body, with_endpoints(base_children(), attempt=body["status"]["attempt"]))
    (created,) = [action.manifest for action in plan.actions if action.manifest["kind"] == "Job"]
    return created["spec"]["template"]["spec"]


def test_what_a_stop_needs_reaches_the_status_as_the_trainer_measured_it():
    plan = run(job_body(status={"attempt": 1}), with_report(running_attempt("12"), **STOP_REPORT))

    written = plan.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert written["checkpointing"] == MEASURED


def test_a_later_step_without_a_measure_keeps_the_last_one():
    before = job_body(status={"attempt": 2, "checkpointing": MEASURED})
    plan = run(before, running_attempt("3", attempt=2))
    assert plan.status.checkpointing == api.CheckpointingStatus.model_validate(MEASURED)


def test_the_first_attempt_gets_the_default_grace_period():
    assert next_trainer_pod(job_body(status={"attempt": 1}))["terminationGracePeriodSeconds"] == 120


def test_a_retry_gets_a_grace_period_that_fits_the_last_measure_rounded_up_to_a_minute():
    retry = job_body(status={"attempt": 2, "preemptions": 1, "checkpointing": MEASURED})  # a stop needs 185 s
    assert next_trainer_pod(retry)["terminationGracePeriodSeconds"] == 240


def test_a_quick_stop_keeps_the_default_grace_period():
    quick = {**MEASURED, "stopSeconds": 45}
    assert (
        next_trainer_pod(job_body(status={"attempt": 2, "checkpointing": quick}))["terminationGracePeriodSeconds"]
        == 120
    )


def test_a_grace_period_the_user_set_is_kept_whatever_the_measure():
    longer = with_grace_period(900, attempt=2, checkpointing=MEASURED)
    shorter = with_grace_period(60, attempt=2, checkpointing=MEASURED)
    assert next_trainer_pod(longer)["terminationGracePeriodSeconds"] == 900
    assert next_trainer_pod(shorter)["terminationGracePeriodSeconds"] == 60


def test_a_grace_period_shorter_than_a_stop_needs_is_a_warning_naming_the_field_its_value_and_the_estimate():
    body = with_grace_period(60, attempt=1, phase="Running")

    plan = run(body, with_report(running_attempt("12"), **STOP_REPORT))

    short = condition(plan.status, api.ConditionType.GRACE_PERIOD_TOO_SHORT)
    assert short is not None and (short.status, short.reason) == ("True", "GracePeriodTooShort")
    assert short.message.startswith("spec.checkpointing.gracePeriodSeconds is 60 s, but a stop needs about 185 s (")
    assert "two checkpoint writes of 14.9 GB of 48 s each" in short.message
    assert "a preempted trainer may lose its last steps" in short.message
    assert [(e.type, e.reason, e.message) for e in plan.events] == [("Warning", "GracePeriodTooShort", short.message)]
    assert plan.status.phase == "Running", "the job runs on"


def test_the_warning_is_posted_once_and_cleared_when_the_grace_period_fits_again():
    children = with_report(running_attempt("12"), **STOP_REPORT)
    first = run(with_grace_period(60, attempt=1, phase="Running"), children)
    status = first.status.model_dump(mode="json", by_alias=True)

    again = run(with_grace_period(60, **status), children)
    raised = run(with_grace_period(300, **status), children)
    unset = run(with_grace_period(None, **status), children)

    assert again.events == []
    fits = condition(raised.status, api.ConditionType.GRACE_PERIOD_TOO_SHORT)
    assert fits is not None and (fits.status, fits.reason) == ("False", "GracePeriodFits")
    assert fits.message == "spec.checkpointing.gracePeriodSeconds is 300 s; a stop needs about 185 s"
    assert raised.events == []
    fitted = condition(unset.status, api.ConditionType.GRACE_PERIOD_TOO_SHORT)
    assert fitted is not None and fitted.status == "False" and fitted.message.startswith("the operator fits it")


def test_a_grace_period_that_fits_puts_no_condition_on_the_job():
    children = with_report(running_attempt("12"), **STOP_REPORT)
    for body in (with_grace_period(185, attempt=1), with_grace_period(None, attempt=1)):
        plan = run(body, children)
        assert condition(plan.status, api.ConditionType.GRACE_PERIOD_TOO_SHORT) is None
        assert plan.events == []


def test_a_trainer_that_ended_is_judged_against_the_grace_period_too():
    """The stage that judges an ended attempt stops the pass early; the check has run before it."""
    children = with_report(with_endpoints(base_children()), step="7", **STOP_REPORT)
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 1, False, True, "BackoffLimitExceeded", False)}
    children["Pod"]["demo-trainer-a"] = pod(
        "demo-trainer-a", "trainer", attempt=1, phase="Failed", terminated=(("trainer", 143, "preempted at step 7"),)
    )
    plan = run(with_grace_period(60, attempt=1, phase="Running"), children)
    short = condition(plan.status, api.ConditionType.GRACE_PERIOD_TOO_SHORT)
    assert short is not None and short.status == "True"
    assert ("Warning", "GracePeriodTooShort") in [(e.type, e.reason) for e in plan.events]
