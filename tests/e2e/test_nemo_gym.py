"""A GRPOJob whose environment is NeMo Gym's own `format_verification` (its `freeform_formatting` resources
server, a `simple_agent` and the `vllm_model` model server, from the NeMo Gym image) trains to Succeeded
with the rows of examples/nemo-gym-format.jsonl. NeMo Gym's servers join the job's Ray cluster at the GCS
address of `<job>-endpoints`: the head's dashboard lists the environment pod as a node of the cluster and
NeMo Gym's servers as its drivers. The rewards NeMo Gym's `/verify` gives differ between rollouts of a row
(so the groups have non-zero advantages) and reach the job's progress."""

from __future__ import annotations

import base64
import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client

from grpojob_api import endpoints as contract
from grpojob_operator import names
from tests.e2e.test_grpojob import GROUP, PLURAL, VERSION, tiny_job, trainer_log, watch_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((REPO / "examples" / "nemo-gym-format.yaml").read_text())
(FORMAT_ENV,) = EXAMPLE["spec"]["environments"]
AGENT = FORMAT_ENV["nemoGym"]["agent"]
ENV_NAME = FORMAT_ENV["name"]
GENERATIONS = 4


def gym_rows() -> str:
    """The rows of examples/nemo-gym-format.jsonl (each names the agent in agent_ref and carries its regex check
    in `verifier`), with the job's sampling parameters set, as NeMo-RL sets them on every row."""
    rows = [json.loads(line) for line in (REPO / "examples" / "nemo-gym-format.jsonl").read_text().splitlines()]
    for row in rows:
        assert row["agent_ref"]["name"] == AGENT
        row["responses_create_params"].update(temperature=1.0, top_p=1.0)
    return "".join(json.dumps(row) + "\n" for row in rows)


def gym_job(name: str, claim: str, max_steps: int) -> dict[str, Any]:
    """The e2e suite's tiny job with the example's NeMo Gym environment and rows instead of ours, without
    checkpoints or retries."""
    job = tiny_job(name, claim, max_steps, backoff_limit=0)
    spec = job["spec"]
    del spec["checkpointing"]
    spec["dataset"] = {"configMap": {"name": "gym-rows", "key": "train.jsonl"}}
    spec["environments"] = [FORMAT_ENV]
    spec["generation"]["maxModelLen"] = 1024
    spec["grpo"] |= {"promptsPerStep": 5, "generationsPerPrompt": GENERATIONS}
    return job


def ray_state(head_ip: str, resource: str, token: str) -> list[dict[str, Any]]:
    """One of the Ray state API's listings (what `ray list nodes` / `ray list jobs` print) from the head's
    dashboard, which answers only with the job's Ray token."""
    response = httpx.get(
        f"http://{head_ip}:{contract.DASHBOARD_PORT}/api/v0/{resource}?limit=1000",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    response.raise_for_status()
    return response.json()["data"]["result"]["result"]


def test_a_grpojob_with_a_nemo_gym_environment_trains_on_rewards_that_vary_its_servers_joined_to_the_jobs_ray_cluster(
    api_client, namespace, grpo_data
):
    core = client.CoreV1Api(api_client)
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "gym-rows"}, "data": {"train.jsonl": gym_rows()}}
    )
    custom = client.CustomObjectsApi(api_client)
    started = time.monotonic()
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, gym_job("gym", grpo_data, 4))
    running = watch_job(api_client, namespace, "gym", 900, until=lambda s: (s.get("step") or 0) >= 1)

    # While it trains: NeMo Gym was given the GCS address of the endpoints, its pod is a node of the job's
    # Ray cluster, and its servers are drivers there.
    child = names.ChildNames("gym")
    endpoints = core.read_namespaced_config_map(child.endpoints, namespace).data
    config = yaml.safe_load(
        core.read_namespaced_config_map(child.nemo_gym_config(ENV_NAME), namespace).data["env.yaml"]
    )
    assert config["ray_head_node_address"] == endpoints["RAY_GCS_ADDRESS"]
    assert endpoints["RAY_GCS_ADDRESS"] == f"gym-head-svc.{namespace}.svc.cluster.local:{contract.GCS_PORT}"
    (gym_pod,) = core.list_namespaced_pod(namespace, label_selector=f"grpo.dev/environment={ENV_NAME}").items
    secret = core.read_namespaced_secret(child.ray_token_secret, namespace)
    token = base64.b64decode(secret.data["auth_token"]).decode()
    nodes = ray_state(endpoints["RAY_HEAD_POD_IP"], "nodes", token)
    drivers = ray_state(endpoints["RAY_HEAD_POD_IP"], "jobs", token)
    gym_node = [n for n in nodes if n["node_ip"] == gym_pod.status.pod_ip and n["state"] == "ALIVE"]
    gym_drivers = [d for d in drivers if (d.get("driver_info") or {}).get("node_ip_address") == gym_pod.status.pod_ip]
    print(f"Ray nodes: {[(n['node_ip'], n['state'], n.get('resources_total')) for n in nodes]}")
    print(f"Ray drivers on the NeMo Gym pod {gym_pod.status.pod_ip}: {len(gym_drivers)} of {len(drivers)}")
    assert len(gym_node) == 1, nodes
    assert not {k: v for k, v in gym_node[0]["resources_total"].items() if k in ("CPU", "GPU") and v}, gym_node
    # ng_run itself and its three servers (the resources server, the agent and vllm_model) each call ray.init.
    assert len(gym_drivers) >= 3, drivers

    watched = watch_job(api_client, namespace, "gym", 1200, watch=running)
    print(f"GRPOJob gym: {watched.phases} in {time.monotonic() - started:.0f}s; rewards by step {watched.rewards}")
    assert watched.status["phase"] == "Succeeded", watched.status
    assert watched.status["step"] == 4
    # format_verification's /verify scores each rollout by its row's regex: rollouts of one row differ.
    log = trainer_log(core, namespace, "gym", 1)
    varied = [int(v) for v in re.findall(r"step \d+/4 .* groups with varied rewards (\d+)/\d+", log)]
    print(f"groups with varied rewards by step: {varied}")
    assert len(varied) == 4 and sum(varied) > 0, log[-3000:]
    assert watched.rewards and all(0.0 <= reward <= 1.0 for reward in watched.rewards.values())
