"""The TensorBoard stage follows spec.logging.tensorboard."""

from __future__ import annotations

from grpojob_operator.observe import DeploymentInfo, OtherInfo, TrainerJobInfo
from grpojob_operator.plan.context import GO_ON
from grpojob_operator.plan.tensorboard import tensorboard

from ..conftest import job_body
from .conftest import NOW, base_children, kinds_and_names, one_pass, run, with_endpoints


def watched_body(status: dict | None = None, **logging) -> dict:
    body = job_body(status=status)
    body["spec"]["logging"] = {"pvc": {"claimName": "logs"}, "tensorboard": True, **logging}
    return body


def test_tensorboard_starts_with_the_job_before_the_ray_head_is_up():
    plan = run(watched_body(), base_children(head_ready=False))
    created = kinds_and_names(plan)
    assert ("Create", "Deployment", "demo-tensorboard") in created
    assert ("Create", "Service", "demo-tensorboard") in created
    assert not any(name == "demo-tensorboard" for _, _, name in kinds_and_names(run(job_body(), base_children())))


def _with_tensorboard(children: dict) -> dict:
    children.setdefault("Deployment", {})["demo-tensorboard"] = DeploymentInfo("demo-tensorboard", 1)
    children["Service"]["demo-tensorboard"] = OtherInfo("demo-tensorboard", False)
    return children


def test_tensorboard_outlives_the_cluster_of_a_finished_job_unless_the_cleanup_deletes_all():
    children = _with_tensorboard(with_endpoints(base_children()))
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 1, True, False, "", False)}
    status = {"attempt": 1, "phase": "Succeeded", "completionTime": NOW.isoformat()}
    kept = {(kind, name) for _, kind, name in kinds_and_names(run(watched_body(status), children))}
    assert ("RayCluster", "demo") in kept and ("Deployment", "demo-tensorboard") not in kept
    body = watched_body(status)
    body["spec"]["cleanupPolicy"] = "DeleteAll"
    deleted = {(kind, name) for _, kind, name in kinds_and_names(run(body, children))}
    assert {("Deployment", "demo-tensorboard"), ("Service", "demo-tensorboard")} <= deleted


def test_turning_tensorboard_off_removes_it():
    children = _with_tensorboard(base_children())
    body = watched_body(tensorboard=False)
    deleted = [(kind, name) for verb, kind, name in kinds_and_names(run(body, children)) if verb == "Delete"]
    assert deleted == [("Deployment", "demo-tensorboard"), ("Service", "demo-tensorboard")]


def test_the_stage_does_nothing_for_a_job_without_tensorboard():
    pass_ = one_pass(job_body(), base_children())
    assert tensorboard(pass_) is GO_ON and pass_.plan.actions == []


def test_the_tensorboard_deployment_goes_where_kueue_placed_the_job():
    pass_ = one_pass(watched_body(), base_children())
    pass_.place = lambda manifest: {**manifest, "placed": True}
    tensorboard(pass_)
    placed = {a.manifest["kind"]: bool(a.manifest.get("placed")) for a in pass_.plan.actions}
    assert placed == {"Deployment": True, "Service": False}
