"""The deadlines stage: spec.activeDeadlineSeconds and a stuck pod fail the job."""

from __future__ import annotations

from datetime import timedelta

from grpojob_operator.plan.context import GO_ON
from grpojob_operator.plan.deadlines import deadlines

from ..conftest import job_body
from .conftest import NOW, base_children, one_pass, pod, run


def test_a_pod_stuck_in_image_pull_backoff_fails_the_job_only_after_the_grace_period():
    children = base_children(head_ready=False)
    stuck = (("ray-worker", "ImagePullBackOff", 'Back-off pulling image "x"'),)
    children["Pod"]["demo-policy-1"] = pod("demo-policy-1", "policy", ready=False, stuck=stuck, ready_since=NOW)
    assert run(job_body(), children).status.phase == "Initializing"
    later = pod("demo-policy-1", "policy", ready=False, stuck=stuck, ready_since=NOW - timedelta(seconds=61))
    children["Pod"]["demo-policy-1"] = later
    plan = run(job_body(), children)
    assert plan.status.phase == "Failed" and plan.status.reason == "ImagePullBackOff"
    assert (
        plan.status.message
        == 'pod demo-policy-1 container ray-worker is in ImagePullBackOff: Back-off pulling image "x"'
    )


def test_active_deadline_counts_from_the_start_time():
    body = job_body()
    body["spec"]["activeDeadlineSeconds"] = 10
    started = (NOW - timedelta(seconds=9)).isoformat()
    assert run({**body, "status": {"startTime": started}}, {}).status.phase == "Initializing"
    late = (NOW - timedelta(seconds=10)).isoformat()
    assert run({**body, "status": {"startTime": late}}, {}).status.reason == "DeadlineExceeded"


def test_the_stage_sets_the_start_time_and_goes_on_within_the_limits():
    pass_ = one_pass(job_body(), base_children())
    assert deadlines(pass_) is GO_ON
    assert pass_.status.start_time == NOW and pass_.plan.actions == []
