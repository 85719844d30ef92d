"""The endpoints stage: `<job>-endpoints` follows the ready head and the attempt."""

from __future__ import annotations

from grpojob_operator.observe import TrainerJobInfo
from grpojob_operator.plan.actions import Replace
from grpojob_operator.plan.context import GO_ON, STOP
from grpojob_operator.plan.endpoints import endpoints

from ..conftest import job_body
from .conftest import base_children, kinds_and_names, one_pass, pod, run, with_endpoints


def test_a_ready_head_publishes_endpoints_before_environments_and_the_trainer():
    plan = run(job_body(), base_children())
    assert kinds_and_names(plan) == [
        ("Create", "ConfigMap", "demo-endpoints"),
        ("Create", "Deployment", "demo-env-math"),
        ("Create", "Service", "demo-env-math"),
        ("Create", "Job", "demo-trainer"),
    ]
    endpoints = plan.actions[0].manifest
    assert endpoints["data"]["RAY_HEAD_POD_IP"] == "10.0.0.2"
    assert plan.status.gcs_address == "demo-head-svc.team-a.svc.cluster.local:6379"
    assert plan.status.attempt == 1


def test_a_replaced_head_pod_rewrites_the_endpoints():
    children = with_endpoints(base_children(head_ip="10.0.0.9"), ip="10.0.0.2")
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 1, False, False, "", False)}
    plan = run(job_body(status={"attempt": 1, "phase": "Running"}), children)
    replaced = [a for a in plan.actions if isinstance(a, Replace)]
    assert len(replaced) == 1 and replaced[0].manifest["data"]["RAY_HEAD_POD_IP"] == "10.0.0.9"


def test_the_stage_publishes_the_head_it_is_handed():
    pass_ = one_pass(job_body(), base_children())
    assert endpoints(pass_) is STOP and pass_.plan.actions == [], "no head, no endpoints"
    pass_.head = pod("demo-head", "ray-head", ip="10.0.0.7")
    assert endpoints(pass_) is GO_ON
    assert pass_.endpoints["RAY_HEAD_POD_IP"] == "10.0.0.7" and pass_.status.attempt == 1
