"""A GRPOJob with a NeMo Gym environment next to one of ours, on the real control plane: the config its
ng_run gets, the Deployment that runs it, and how its pods follow a replaced Ray head."""

from __future__ import annotations

import json

import pytest
import yaml
from kubernetes.client import ApiException

from .conftest import eventually, job_manifest

pytestmark = pytest.mark.integration

TOOL_CALL = "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml"
AGENT = "example_single_tool_call_simple_agent"
HASH = "grpo.dev/nemo-gym-config-hash"


def gym_job(name: str) -> dict:
    return job_manifest(
        name,
        environments=[
            {"name": "arithmetic", "command": ["python", "-m", "grpojob_trainer.environments", "arithmetic"]},
            {
                "name": "tools",
                "port": 9000,
                "nemoGym": {
                    "configPaths": [TOOL_CALL],
                    "agent": AGENT,
                    "overrides": {AGENT: {"responses_api_agents": {"simple_agent": {"max_steps": 3}}}},
                },
            },
        ],
    )


def test_a_nemo_gym_environment_gets_its_config_and_pods_and_follows_a_new_head(operator, jobs, namespace):
    jobs.create(gym_job("gym"))
    jobs.wait_phase("gym", "Running")
    endpoints = jobs.config_map("gym-endpoints")
    assert endpoints is not None
    service = f"http://gym-env-tools.{namespace}.svc.cluster.local:9000"
    assert json.loads(endpoints["PENGUIN_ENV_URLS"]) == {
        "arithmetic": f"http://gym-env-arithmetic.{namespace}.svc.cluster.local:8080",
        "tools": service,
        AGENT: service,
    }

    # NeMo Gym's config: the job's generation Service, served model name and Ray GCS address.
    rendered = jobs.config_map("gym-env-tools-nemo-gym")
    assert rendered is not None
    config = yaml.safe_load(rendered["env.yaml"])
    assert config["policy_base_url"] == endpoints["POLICY_BASE_URL"]
    assert config["policy_model_name"] == "tiny"
    assert config["ray_head_node_address"] == endpoints["RAY_GCS_ADDRESS"]
    assert config["config_paths"][-1] == TOOL_CALL
    assert config[AGENT]["responses_api_agents"]["simple_agent"] == {"max_steps": 3, "host": "0.0.0.0", "port": 9000}

    # The Deployment: NeMo Gym's image, ray start then ng_run, the config mounted, the endpoints in env.
    deployment = jobs.apps.read_namespaced_deployment("gym-env-tools", namespace)
    pod_spec = deployment.spec.template.spec
    (container,) = pod_spec.containers
    assert container.image == "ghcr.io/grpojob/nemo-gym:0.1.0"
    assert "ray start" in container.command[-1] and "gym env start" in container.command[-1]
    assert container.env_from[0].config_map_ref.name == "gym-endpoints"
    assert container.security_context.read_only_root_filesystem is True
    volumes = {v.name: v for v in pod_spec.volumes}
    assert volumes["config"].config_map.name == "gym-env-tools-nemo-gym"
    assert volumes["shm"].empty_dir.medium == "Memory"
    assert jobs.core.read_namespaced_service("gym-env-tools", namespace).spec.ports[0].target_port == 9000
    # Our own environment runs as before.
    assert (
        jobs.apps.read_namespaced_deployment("gym-env-arithmetic", namespace)
        .spec.template.spec.containers[0]
        .image.endswith("environments:0.1.0")
    )
    first_hash = deployment.spec.template.metadata.annotations[HASH]
    (first_pod,) = jobs.pods("grpo.dev/job=gym,grpo.dev/environment=tools")
    (our_pod,) = jobs.pods("grpo.dev/job=gym,grpo.dev/environment=arithmetic")

    # The head pod is replaced: new endpoints, and the NeMo Gym pods (only they) roll onto the new head.
    (head,) = jobs.pods("ray.io/cluster=gym,ray.io/node-type=head")
    jobs.core.delete_namespaced_pod(head.metadata.name, namespace)

    def new_head_published() -> bool:
        heads = [p for p in jobs.pods("ray.io/cluster=gym,ray.io/node-type=head") if p.status.pod_ip]
        current = jobs.config_map("gym-endpoints")["RAY_HEAD_POD_IP"]
        return any(p.metadata.name != head.metadata.name and p.status.pod_ip == current for p in heads)

    eventually(new_head_published, "the new head pod's IP in the endpoints", 60)

    def rolled() -> bool:
        template = jobs.apps.read_namespaced_deployment("gym-env-tools", namespace).spec.template
        pods = [
            p
            for p in jobs.pods("grpo.dev/job=gym,grpo.dev/environment=tools")
            if p.metadata.name != first_pod.metadata.name and p.status.phase == "Running"
        ]
        return template.metadata.annotations[HASH] != first_hash and bool(pods)

    eventually(rolled, "a NeMo Gym pod of the new config hash", 60)
    (still_ours,) = jobs.pods("grpo.dev/job=gym,grpo.dev/environment=arithmetic")
    assert still_ours.metadata.name == our_pod.metadata.name
    assert jobs.status("gym")["phase"] in ("Running", "Initializing")


@pytest.mark.parametrize(
    ("nemo_gym", "extra", "message"),
    [
        ({"configPaths": ["resources_servers/../x.yaml"], "agent": AGENT}, {}, "must not contain `..`"),
        ({"configPaths": [TOOL_CALL], "agent": AGENT}, {"command": ["serve"]}, "command and args must be empty"),
    ],
)
def test_the_api_server_refuses_what_the_operator_would(jobs, grpojob_crd, nemo_gym, extra, message):
    manifest = job_manifest("bad", environments=[{"name": "tools", "nemoGym": nemo_gym, **extra}])
    with pytest.raises(ApiException) as refused:
        jobs.create(manifest)
    assert refused.value.status == 422 and message in refused.value.body
