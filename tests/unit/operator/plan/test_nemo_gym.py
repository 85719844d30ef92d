"""NeMo Gym environments in the plan: their config and pods follow the endpoints and the Ray head."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from grpojob_operator import names
from grpojob_operator.children.nemo_gym import build_nemo_gym_config_map, build_nemo_gym_deployment
from grpojob_operator.children.trainer import build_trainer_job
from grpojob_operator.observe import ConfigMapInfo, DeploymentInfo, Observed, OtherInfo, PodInfo
from grpojob_operator.plan import plan as plan_job
from grpojob_operator.plan.actions import Create, Delete, Patch, Plan, Replace

from ..children.jobs import GYM_ENV, GYM_JOB, GYM_SETTINGS, gym_body, gym_endpoints
from ..conftest import children_up_to_the_head

NOW = datetime(2026, 11, 30, 10, 0, 10, tzinfo=UTC)
SETTINGS, JOB, endpoints = GYM_SETTINGS, GYM_JOB, gym_endpoints


def children(head_ip: str = "10.0.0.2", head_name: str = "demo-head") -> dict:
    head = PodInfo(
        name=head_name,
        component="ray-head",
        attempt=None,
        phase="Running",
        ready=True,
        ip=head_ip,
        deleting=False,
        created=NOW - timedelta(seconds=5),
        ready_since=None,
    )
    return children_up_to_the_head(JOB, head)


def with_gym_running(kids: dict, ip: str, head: str = "demo-head") -> dict:
    """The endpoints, environments and NeMo Gym config as they were written for head pod ``head`` at ``ip``."""
    data = endpoints(ip)
    config = build_nemo_gym_config_map(JOB, GYM_ENV, data)
    deployment = build_nemo_gym_deployment(JOB, GYM_ENV, SETTINGS, data, head)
    kids["ConfigMap"]["demo-endpoints"] = ConfigMapInfo("demo-endpoints", tuple(sorted(data.items())))
    kids["ConfigMap"]["demo-env-tools-nemo-gym"] = ConfigMapInfo(
        "demo-env-tools-nemo-gym", tuple(sorted(config["data"].items()))
    )
    config_hash = deployment["spec"]["template"]["metadata"]["annotations"][names.NEMO_GYM_CONFIG_HASH_ANNOTATION]
    kids["Deployment"] = {
        "demo-env-math": DeploymentInfo("demo-env-math", 1),
        "demo-env-tools": DeploymentInfo("demo-env-tools", 1, config_hash),
    }
    kids["Service"]["demo-env-math"] = OtherInfo("demo-env-math", False)
    kids["Service"]["demo-env-tools"] = OtherInfo("demo-env-tools", False)
    return kids


def plan(kids: dict, status: dict | None = None) -> Plan:
    return plan_job(gym_body() | ({"status": status} if status else {}), Observed(kids), SETTINGS, NOW)


def test_the_nemo_gym_config_is_written_before_its_deployment_after_the_endpoints():
    actions = [(type(a).__name__, a.manifest["kind"], a.manifest["metadata"]["name"]) for a in plan(children()).actions]
    assert actions[:6] == [
        ("Create", "ConfigMap", "demo-endpoints"),
        ("Create", "Deployment", "demo-env-math"),
        ("Create", "Service", "demo-env-math"),
        ("Create", "ConfigMap", "demo-env-tools-nemo-gym"),
        ("Create", "Deployment", "demo-env-tools"),
        ("Create", "Service", "demo-env-tools"),
    ]


def test_a_settled_job_only_waits_for_its_trainer():
    actions = plan(with_gym_running(children(), "10.0.0.2"), {"attempt": 1}).actions
    assert actions == [Create(build_trainer_job(JOB, SETTINGS, 1))]


def test_a_replaced_head_rolls_the_nemo_gym_pods_and_not_our_own_environments():
    kids = with_gym_running(children(head_ip="10.0.0.9"), "10.0.0.2")
    actions = plan(kids, {"attempt": 1}).actions
    replaced = [a.manifest["metadata"]["name"] for a in actions if isinstance(a, Replace)]
    assert replaced == ["demo-endpoints"]  # the config holds the GCS Service address, which stays
    (patch,) = [a for a in actions if isinstance(a, Patch)]
    assert patch.kind == "Deployment" and patch.name == "demo-env-tools"
    new_hash = patch.patch["spec"]["template"]["metadata"]["annotations"][names.NEMO_GYM_CONFIG_HASH_ANNOTATION]
    expected = build_nemo_gym_deployment(JOB, GYM_ENV, SETTINGS, endpoints("10.0.0.9"), "demo-head")
    assert new_hash == expected["spec"]["template"]["metadata"]["annotations"][names.NEMO_GYM_CONFIG_HASH_ANNOTATION]


def test_suspending_removes_the_nemo_gym_config_with_its_environment():
    body = gym_body()
    body["spec"]["suspend"] = True
    kids = with_gym_running(children(), "10.0.0.2")
    actions = plan_job(body, Observed(kids), SETTINGS, NOW).actions
    deleted = {(a.kind, a.name) for a in actions if isinstance(a, Delete)}
    assert {("ConfigMap", "demo-env-tools-nemo-gym"), ("Deployment", "demo-env-tools")} <= deleted


def test_a_new_head_pod_on_the_same_ip_rolls_the_nemo_gym_pods_too():
    kids = with_gym_running(children(head_name="demo-head-new"), "10.0.0.2", head="demo-head")
    actions = plan(kids, {"attempt": 1}).actions
    assert not [a for a in actions if isinstance(a, Replace)]  # the endpoints are the same
    assert [(a.kind, a.name) for a in actions if isinstance(a, Patch)] == [("Deployment", "demo-env-tools")]
