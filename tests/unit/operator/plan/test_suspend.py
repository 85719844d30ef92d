"""The suspend stages: spec.suspend deletes what runs; resuming counts the deadlines afresh."""

from __future__ import annotations

from datetime import timedelta

from grpojob_api import v1alpha1 as api
from grpojob_operator.observe import TrainerJobInfo
from grpojob_operator.plan.conditions import condition
from grpojob_operator.plan.context import GO_ON
from grpojob_operator.plan.suspend import resumed
from grpojob_operator.plan.suspend import suspended as suspended_stage

from ..conftest import job_body
from .conftest import (
    NOW,
    base_children,
    kinds_and_names,
    one_pass,
    run,
    running_attempt,
    stalling_job,
    status_of,
    with_endpoints,
)


def test_suspend_deletes_the_workload_and_keeps_config():
    children = with_endpoints(base_children())
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 1, False, False, "", False)}
    body = job_body(status={"attempt": 1, "phase": "Running", "startTime": NOW.isoformat()})
    body["spec"]["suspend"] = True
    plan = run(body, children)
    assert sorted(kinds_and_names(plan)) == [
        ("Delete", "ConfigMap", "demo-endpoints"),
        ("Delete", "Deployment", "demo-env-math"),
        ("Delete", "Job", "demo-trainer"),
        ("Delete", "RayCluster", "demo"),
        ("Delete", "Service", "demo-env-math"),
    ]
    assert plan.status.phase == "Suspended" and plan.status.start_time is None


def test_a_suspended_job_counts_its_progress_deadline_afresh_when_it_resumes():
    stale = (NOW - timedelta(days=1)).isoformat()
    body = stalling_job(step=4, progressTime=stale)
    body["spec"]["suspend"] = True
    suspended = run(body, running_attempt("4"))
    assert suspended.status.phase == "Suspended" and suspended.status.progress_time is None
    resumed = run({**stalling_job(), "status": status_of(suspended)}, running_attempt("4"))
    assert resumed.status.phase == "Running" and resumed.status.progress_time == NOW


def test_resuming_turns_the_suspended_condition_false_and_goes_on():
    suspended = {"type": "Suspended", "status": "True", "reason": "Suspended", "lastTransitionTime": NOW.isoformat()}
    pass_ = one_pass(job_body(status={"phase": "Suspended", "conditions": [suspended]}), {})
    assert suspended_stage(pass_) is GO_ON
    assert resumed(pass_) is GO_ON
    assert condition(pass_.status, api.ConditionType.SUSPENDED).reason == "Resumed"
