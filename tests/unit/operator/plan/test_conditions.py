"""Conditions and the verdicts that end a job."""

from __future__ import annotations

from datetime import timedelta

from grpojob_api import v1alpha1 as api
from grpojob_operator.plan.conditions import condition, reject

from ..conftest import job_body
from .conftest import NOW, run, status_of


def test_condition_transition_time_only_moves_when_the_status_flips():
    plan = run(job_body(), {})
    first = condition(plan.status, api.ConditionType.RAY_CLUSTER_READY)
    later = run(job_body(status=status_of(plan)), {}, NOW + timedelta(seconds=30))
    again = condition(later.status, api.ConditionType.RAY_CLUSTER_READY)
    assert first is not None and again is not None
    assert again.last_transition_time == first.last_transition_time
    assert later.events == []


def test_a_child_the_api_refuses_fails_the_job_with_its_answer():
    plan = reject(run(job_body(), {}), "HTTP 422: subPath must not contain '..'", NOW)
    assert plan.status.phase == "Failed" and plan.status.reason == "ChildRejected"
    assert "subPath" in plan.status.message
