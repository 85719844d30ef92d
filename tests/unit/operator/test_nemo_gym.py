"""NeMo Gym environments: the config ng_run gets, the pods that run it, and how they follow the Ray head."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from pydantic import ValidationError

from grpojob_api import v1alpha1 as api
from grpojob_api.admission import parse_job
from grpojob_operator import manifests, names, nemo_gym, state
from grpojob_operator.observe import ConfigMapInfo, DeploymentInfo, Observed, OtherInfo, PodInfo
from grpojob_operator.settings import OperatorSettings

from .conftest import children_up_to_the_head, job_body

NOW = datetime(2026, 11, 30, 10, 0, 10, tzinfo=UTC)
SETTINGS = OperatorSettings(nemo_gym_image="example/nemo-gym:1")
TOOL_CALL = "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml"
AGENT = "example_single_tool_call_simple_agent"


def gym_body(**nemo_gym_fields) -> dict:
    body = job_body()
    body["spec"]["environments"] = [
        {"name": "math", "command": ["python", "-m", "grpojob_trainer.environments", "arithmetic"]},
        {"name": "tools", "port": 9000, "nemoGym": {"configPaths": [TOOL_CALL], "agent": AGENT, **nemo_gym_fields}},
    ]
    return body


JOB = parse_job(gym_body())
GYM_ENV = JOB.spec.environments[1]


def endpoints(ip: str = "10.0.0.2") -> dict[str, str]:
    return manifests.endpoints_data(JOB, SETTINGS, ip, 1)


def rendered(job: api.GRPOJob = JOB, ip: str = "10.0.0.2") -> dict:
    config_map = manifests.build_nemo_gym_config_map(job, job.spec.environments[1], endpoints(ip))
    return yaml.safe_load(config_map["data"][nemo_gym.CONFIG_FILE])


def test_the_config_points_nemo_gym_at_the_jobs_policy_ray_cluster_and_port():
    config = rendered()
    assert config["config_paths"] == [api.NEMO_GYM_POLICY_MODEL_CONFIG, TOOL_CALL]
    assert config["policy_base_url"] == "http://demo-generation.team-a.svc.cluster.local:8000/v1"
    assert config["policy_model_name"] == "policy"
    assert config["ray_head_node_address"] == "demo-head-svc.team-a.svc.cluster.local:6379"
    assert config["ray_head_node_address"] == endpoints()["RAY_GCS_ADDRESS"]
    assert config["head_server"] == {"host": "127.0.0.1", "port": 11000}
    assert config[AGENT] == {"responses_api_agents": {"simple_agent": {"host": "0.0.0.0", "port": 9000}}}


def test_overrides_merge_under_what_the_operator_sets():
    job = parse_job(
        gym_body(
            agentServer="tool_agent",
            overrides={
                AGENT: {"responses_api_agents": {"tool_agent": {"max_steps": 4, "port": 1}}},
                "example_single_tool_call": {"resources_servers": {"example_single_tool_call": {"x": [1, 2]}}},
            },
        )
    )
    config = rendered(job)
    assert config[AGENT] == {"responses_api_agents": {"tool_agent": {"max_steps": 4, "port": 9000, "host": "0.0.0.0"}}}
    assert config["example_single_tool_call"] == {"resources_servers": {"example_single_tool_call": {"x": [1, 2]}}}


@pytest.mark.parametrize(
    ("nemo_gym_block", "field", "words"),
    [
        ({"configPaths": ["/etc/x.yaml"], "agent": AGENT}, "configPaths", "pattern"),
        ({"configPaths": ["resources_servers/../x.yaml"], "agent": AGENT}, "configPaths", "`..`"),
        ({"configPaths": [], "agent": AGENT}, "configPaths", "at least 1"),
        ({"configPaths": [TOOL_CALL]}, "agent", "required"),
        (
            {"configPaths": [TOOL_CALL], "agent": AGENT, "overrides": {"ray_head_node_address": "x:1"}},
            "overrides",
            "set by the operator",
        ),
    ],
)
def test_a_bad_nemo_gym_block_is_refused_naming_the_field(nemo_gym_block, field, words):
    body = job_body()
    body["spec"]["environments"] = [{"name": "tools", "nemoGym": nemo_gym_block}]
    with pytest.raises(ValidationError) as error:
        parse_job(body)
    assert f"nemoGym.{field}" in str(error.value) and words in str(error.value)


def test_a_nemo_gym_environment_takes_no_command():
    body = job_body()
    body["spec"]["environments"] = [
        {"name": "tools", "command": ["x"], "nemoGym": {"configPaths": [TOOL_CALL], "agent": AGENT}}
    ]
    with pytest.raises(ValidationError, match="command and args must be empty with nemoGym"):
        parse_job(body)


def test_rows_reach_the_agent_by_its_nemo_gym_name_and_by_the_environment_name():
    urls = json.loads(endpoints()["PENGUIN_ENV_URLS"])
    service = "http://demo-env-tools.team-a.svc.cluster.local:9000"
    assert urls == {"math": "http://demo-env-math.team-a.svc.cluster.local:8080", "tools": service, AGENT: service}
    service_manifest = manifests.build_environment_service(JOB, GYM_ENV)
    assert service_manifest["spec"]["ports"] == [{"name": "http", "port": 9000, "targetPort": 9000}]


def test_the_pod_joins_ray_then_runs_ng_run_on_a_read_only_root_as_non_root():
    deployment = manifests.build_nemo_gym_deployment(JOB, GYM_ENV, SETTINGS, endpoints(), "demo-head")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "example/nemo-gym:1"
    assert container["command"][0] == "grpojob-supervise"  # SIGTERM becomes SIGINT for every server
    script = container["command"][-1]
    steps = [
        "cp /etc/nemo-gym/env.yaml env.yaml",
        'ray start --address="$RAY_GCS_ADDRESS" --num-cpus=0',
        "gym env start",
    ]
    assert [script.index(step) for step in steps] == sorted(script.index(step) for step in steps)
    assert "+skip_venv_if_present=true" in script
    assert container["envFrom"] == [{"configMapRef": {"name": "demo-endpoints"}}]
    assert {"name": "RAY_AUTH_MODE", "value": "token"} in container["env"]
    token = {"secretKeyRef": {"name": "demo", "key": "auth_token"}}
    assert {"name": "RAY_AUTH_TOKEN", "valueFrom": token} in container["env"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    assert f"--object-store-memory={1 << 30}" in script  # fits in /dev/shm
    assert volumes[mounts["/etc/nemo-gym"]]["configMap"] == {"name": "demo-env-tools-nemo-gym"}
    home = next(e["value"] for e in container["env"] if e["name"] == "HOME")
    assert home == container["workingDir"] == "/tmp" and "emptyDir" in volumes[mounts["/tmp"]]
    assert container["readinessProbe"]["httpGet"] == {"path": "/", "port": 9000}


def test_a_new_head_changes_the_pod_templates_hash_even_on_the_same_ip_but_a_new_attempt_does_not():
    def template_hash(data: dict[str, str], head: str = "demo-head-a") -> str:
        deployment = manifests.build_nemo_gym_deployment(JOB, GYM_ENV, SETTINGS, data, head)
        return deployment["spec"]["template"]["metadata"]["annotations"][names.NEMO_GYM_CONFIG_HASH_ANNOTATION]

    first = template_hash(endpoints("10.0.0.2"))
    assert template_hash(manifests.endpoints_data(JOB, SETTINGS, "10.0.0.2", 2)) == first
    assert template_hash(endpoints("10.0.0.9")) != first
    assert template_hash(endpoints("10.0.0.2"), head="demo-head-b") != first


# ------------------------------------------------------------------------------------------------
# the state machine


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
    config = manifests.build_nemo_gym_config_map(JOB, GYM_ENV, data)
    deployment = manifests.build_nemo_gym_deployment(JOB, GYM_ENV, SETTINGS, data, head)
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


def plan(kids: dict, status: dict | None = None) -> state.Plan:
    return state.plan(gym_body() | ({"status": status} if status else {}), Observed(kids), SETTINGS, NOW)


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
    assert actions == [state.Create(manifests.build_trainer_job(JOB, SETTINGS, 1))]


def test_a_replaced_head_rolls_the_nemo_gym_pods_and_not_our_own_environments():
    kids = with_gym_running(children(head_ip="10.0.0.9"), "10.0.0.2")
    actions = plan(kids, {"attempt": 1}).actions
    replaced = [a.manifest["metadata"]["name"] for a in actions if isinstance(a, state.Replace)]
    assert replaced == ["demo-endpoints"]  # the config holds the GCS Service address, which stays
    (patch,) = [a for a in actions if isinstance(a, state.Patch)]
    assert patch.kind == "Deployment" and patch.name == "demo-env-tools"
    new_hash = patch.patch["spec"]["template"]["metadata"]["annotations"][names.NEMO_GYM_CONFIG_HASH_ANNOTATION]
    expected = manifests.build_nemo_gym_deployment(JOB, GYM_ENV, SETTINGS, endpoints("10.0.0.9"), "demo-head")
    assert new_hash == expected["spec"]["template"]["metadata"]["annotations"][names.NEMO_GYM_CONFIG_HASH_ANNOTATION]


def test_suspending_removes_the_nemo_gym_config_with_its_environment():
    body = gym_body()
    body["spec"]["suspend"] = True
    kids = with_gym_running(children(), "10.0.0.2")
    actions = state.plan(body, Observed(kids), SETTINGS, NOW).actions
    deleted = {(a.kind, a.name) for a in actions if isinstance(a, state.Delete)}
    assert {("ConfigMap", "demo-env-tools-nemo-gym"), ("Deployment", "demo-env-tools")} <= deleted


def test_a_new_head_pod_on_the_same_ip_rolls_the_nemo_gym_pods_too():
    kids = with_gym_running(children(head_name="demo-head-new"), "10.0.0.2", head="demo-head")
    actions = plan(kids, {"attempt": 1}).actions
    assert not [a for a in actions if isinstance(a, state.Replace)]  # the endpoints are the same
    assert [(a.kind, a.name) for a in actions if isinstance(a, state.Patch)] == [("Deployment", "demo-env-tools")]
