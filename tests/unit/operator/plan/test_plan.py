"""The plan as a whole: a valid job walks the stages in order; an invalid one fails once, naming the field."""

from __future__ import annotations

import grpojob_operator.plan as planning
from grpojob_operator.plan.context import GO_ON, STOP, Pass

from ..conftest import job_body
from .conftest import run, status_of


def test_invalid_spec_fails_once_naming_the_field_and_then_stays_quiet():
    body = job_body()
    body["spec"]["generation"] = {"maxModelLen": 64, "maxNewTokens": 64}
    plan = run(body, {})
    assert plan.actions == []
    assert plan.status.phase == "Failed" and plan.status.reason == "InvalidSpec"
    assert "spec.generation.maxNewTokens" in plan.status.message
    again = run({**body, "status": status_of(plan)}, {})
    assert again.actions == [] and again.events == []
    assert status_of(again) == status_of(plan)


def test_unknown_field_is_reported_with_its_path():
    body = job_body()
    body["spec"]["environments"][0]["replica"] = 2
    plan = run(body, {})
    assert "spec.environments[0].replica" in plan.status.message


def test_the_vllm_backend_without_gpus_is_refused_naming_the_field():
    body = job_body()
    body["spec"]["generation"] |= {"backend": "vllm", "gpusPerReplica": 0}
    plan = run(body, {})
    assert plan.status.reason == "InvalidSpec" and "spec.generation.backend" in plan.status.message
    assert plan.actions == []
    body["spec"]["generation"]["gpusPerReplica"] = 1
    assert run(body, {}).status.phase == "Initializing"


def test_the_stages_run_in_order_until_one_stops_the_pass(monkeypatch):
    ran = []

    def stage(name: str, goes_on: bool):
        def run_stage(pass_: Pass) -> bool:
            ran.append(name)
            return goes_on

        return run_stage

    monkeypatch.setattr(planning, "STAGES", (stage("a", GO_ON), stage("b", STOP), stage("c", GO_ON)))
    run(job_body(), {})
    assert ran == ["a", "b"]


def test_a_valid_job_walks_the_stages_in_the_order_of_its_children():
    assert [s.__name__ for s in planning.STAGES] == [
        "finished",
        "suspended",
        "resumed",
        "deadlines",
        "admission",
        "network_policy",
        "model",
        "ray_cluster",
        "tensorboard",
        "reported",
        "ray_head",
        "endpoints",
        "environments",
        "trainer",
    ]
