"""NeMo Gym environments: the config ng_run gets and the pods that run it."""

from __future__ import annotations

import json

import pytest
import yaml
from pydantic import ValidationError

from grpojob_api import v1alpha1 as api
from grpojob_api.admission import parse_job
from grpojob_api.nemo_gym import CONFIG_FILE
from grpojob_operator import names
from grpojob_operator.children.endpoints import endpoints_data
from grpojob_operator.children.environments import build_environment_service
from grpojob_operator.children.nemo_gym import build_nemo_gym_config_map, build_nemo_gym_deployment

from ..conftest import job_body
from .jobs import AGENT, GYM_ENV, GYM_JOB, GYM_SETTINGS, TOOL_CALL, gym_body, gym_endpoints

SETTINGS, JOB, endpoints = GYM_SETTINGS, GYM_JOB, gym_endpoints


def rendered(job: api.GRPOJob = JOB, ip: str = "10.0.0.2") -> dict:
    config_map = build_nemo_gym_config_map(job, job.spec.environments[1], endpoints(ip))
    return yaml.safe_load(config_map["data"][CONFIG_FILE])


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
    service_manifest = build_environment_service(JOB, GYM_ENV)
    assert service_manifest["spec"]["ports"] == [{"name": "http", "port": 9000, "targetPort": 9000}]


def test_the_pod_joins_ray_then_runs_ng_run_on_a_read_only_root_as_non_root():
    deployment = build_nemo_gym_deployment(JOB, GYM_ENV, SETTINGS, endpoints(), "demo-head")
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
        deployment = build_nemo_gym_deployment(JOB, GYM_ENV, SETTINGS, data, head)
        return deployment["spec"]["template"]["metadata"]["annotations"][names.NEMO_GYM_CONFIG_HASH_ANNOTATION]

    first = template_hash(endpoints("10.0.0.2"))
    assert template_hash(endpoints_data(JOB, SETTINGS, "10.0.0.2", 2)) == first
    assert template_hash(endpoints("10.0.0.9")) != first
    assert template_hash(endpoints("10.0.0.2"), head="demo-head-b") != first
