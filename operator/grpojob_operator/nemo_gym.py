"""NeMo Gym environments: the config `ng_run` starts NeMo Gym's servers with, and how their pod runs it.

A NeMo Gym environment (`spec.environments[].nemoGym`) runs NeMo Gym's own servers: the resources
servers and agent of its `configPaths`, and the model server `policy_model`, which the operator points
at the job's generation Service. `ng_run` reads the rendered config as its Hydra config (so it wins
over the config files and over an `env.yaml` the image may carry); NeMo Gym's servers join the job's
Ray cluster at `ray_head_node_address`, through the raylet the pod starts first as a zero-resource node
(a Ray driver needs a raylet on its own node, as the trainer pod does).

Pure functions: the builders in `manifests` put the results into the ConfigMap and the Deployment.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import yaml

from grpojob_api import v1alpha1 as api

CONFIG_DIR = "/etc/nemo-gym"
CONFIG_NAME = "nemo-gym"
CONFIG_FILE = f"{CONFIG_NAME}.yaml"
HEAD_SERVER_PORT = 11000  # NeMo Gym's default; fixed so that it never takes the agent's port
STATE_DIR = "/var/lib/nemo-gym"
HOME_DIR = f"{STATE_DIR}/home"  # Ray and NeMo Gym write $HOME/.ray, ~/.cache
WORK_DIR = f"{STATE_DIR}/work"  # ng_run's working directory: Hydra's outputs/, NeMo Gym's cache/ and results/
# NeMo Gym's vllm_model sends `Authorization: Bearer <policy_api_key>`; the generation server asks for none.
POLICY_API_KEY = "none"

# The container's command. `ray start` joins the job's Ray cluster as a node without resources (nothing
# is scheduled on it) and returns once the raylet runs; `ng_run` then connects to it. ng_run stops its
# servers only on SIGINT (KeyboardInterrupt), so the pod's SIGTERM is passed on as SIGINT and the script
# waits for ng_run to have stopped them.
LAUNCH_SCRIPT = f"""set -eu
ray start --address="$RAY_GCS_ADDRESS" --num-cpus=0 --num-gpus=0 --disable-usage-stats
ng_run --config-path={CONFIG_DIR} --config-name={CONFIG_NAME} &
ng_run_pid=$!
trap 'kill -INT "$ng_run_pid"; wait "$ng_run_pid"; exit' TERM INT
wait "$ng_run_pid"
"""


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in: nested mappings merge key by key, anything else is replaced."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def render_config(job: api.GRPOJob, env: api.EnvironmentSpec, endpoints: Mapping[str, str]) -> dict[str, Any]:
    """NeMo Gym's config for environment ``env``, from the job and the data of `<job>-endpoints`.

    The user's overrides come first; what the operator sets wins over them: the config files (the policy
    model server's first), the generation Service as the policy, the job's Ray cluster, the head server's
    port and the agent's host and port (the environment's Service sends `/run` there). The other servers
    listen on loopback, on ports NeMo Gym picks inside the pod.
    """
    gym = env.nemo_gym
    if gym is None:
        raise ValueError(f"environment {env.name} is not a NeMo Gym environment")
    config_paths = list(dict.fromkeys([gym.policy_model_config_path, *gym.config_paths]))
    owned = {
        "config_paths": config_paths,
        "policy_base_url": endpoints["POLICY_BASE_URL"],
        "policy_api_key": POLICY_API_KEY,
        "policy_model_name": job.spec.model.served_model_name,
        "ray_head_node_address": endpoints["RAY_GCS_ADDRESS"],
        "default_host": "127.0.0.1",
        "head_server": {"host": "127.0.0.1", "port": HEAD_SERVER_PORT},
        gym.agent: {"responses_api_agents": {gym.agent_server: {"host": "0.0.0.0", "port": env.port}}},
    }
    return deep_merge(gym.overrides, owned)


def config_yaml(config: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(config), sort_keys=False)


def config_hash(config_text: str, endpoints: Mapping[str, str]) -> str:
    """What the environment's pods must be restarted for: their config, or a new Ray head (its pod IP), whose
    cluster the running raylet and servers are not part of."""
    digest = hashlib.sha256(config_text.encode())
    digest.update(b"\0" + endpoints.get("RAY_HEAD_POD_IP", "").encode())
    return digest.hexdigest()[:16]
