"""The finished stage: a job that has ended is cleaned up as its policy says, then deleted after its TTL."""

from __future__ import annotations

from datetime import timedelta

from grpojob_operator.observe import TrainerJobInfo
from grpojob_operator.plan.actions import DeleteJob
from grpojob_operator.plan.context import GO_ON, STOP
from grpojob_operator.plan.finished import finished

from ..conftest import job_body
from .conftest import NOW, base_children, kinds_and_names, one_pass, run, with_endpoints


def test_finished_job_cleanup_keeps_the_trainer_job_by_default_and_ttl_deletes_the_job():
    children = with_endpoints(base_children())
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 1, True, False, "", False)}
    done = (NOW - timedelta(seconds=30)).isoformat()
    body = job_body(status={"attempt": 1, "phase": "Succeeded", "completionTime": done})
    plan = run(body, children)
    deleted = {(kind, name) for _, kind, name in kinds_and_names(plan)}
    assert ("RayCluster", "demo") in deleted and ("Deployment", "demo-env-math") in deleted
    assert ("Job", "demo-trainer") not in deleted
    assert not any(isinstance(a, DeleteJob) for a in plan.actions)
    body["spec"]["ttlSecondsAfterFinished"] = 30
    assert any(isinstance(a, DeleteJob) for a in run(body, children).actions)


def test_the_stage_passes_over_a_job_that_has_not_ended_and_ends_the_pass_of_one_that_has():
    running = one_pass(job_body(status={"phase": "Running"}), {})
    assert finished(running) is GO_ON and running.plan.actions == []
    done = one_pass(job_body(status={"phase": "Succeeded"}), with_endpoints(base_children()))
    assert finished(done) is STOP and ("Delete", "RayCluster", "demo") in kinds_and_names(done.plan)
