"""NeMo Gym environments: the config `ng_run` starts NeMo Gym's servers with, and how their pod runs it.

A NeMo Gym environment (`spec.environments[].nemoGym`) runs NeMo Gym's own servers: the resources
servers and agent of its `configPaths`, and the model server `policy_model`, which the operator points
at the job's generation Service. NeMo Gym reads an `env.yaml` in its working directory over the config
files (and its command-line overrides over that): the rendered config is that file. NeMo Gym's servers
join the job's Ray cluster at `ray_head_node_address`, through the raylet the pod starts first as a
node without resources (a Ray driver needs a raylet on its own node, as the trainer pod does).

The pod runs the NeMo Gym image (`images/nemo-gym/`): `grpojob-supervise` turns the pod's SIGTERM into
SIGINT for every server (NeMo Gym stops only on KeyboardInterrupt), and each server this image
prepares has its virtual environment under `IMAGE_SERVERS_DIR`, so nothing installs at start; one it did
not prepare stops the pod before anything starts (`grpojob-servers check`).

Pure functions: the config, and the ConfigMap and the Deployment that carry it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import yaml

from grpojob_api import endpoints as contract
from grpojob_api import v1alpha1 as api
from grpojob_operator import names
from grpojob_operator.children.environments import environment_deployment, environment_selector
from grpojob_operator.children.meta import Manifest, job_ref, metadata
from grpojob_operator.children.raycluster import ray_auth_env
from grpojob_operator.settings import OperatorSettings

CONFIG_DIR = "/etc/nemo-gym"
CONFIG_FILE = "env.yaml"  # the name NeMo Gym looks for in its working directory
WORK_DIR = "/tmp"  # an emptyDir: HOME, the working directory (cache/, results/, Hydra's outputs/), /tmp/ray
IMAGE_SERVERS_DIR = "/opt/nemo-gym/servers"  # the NeMo Gym image's prepared virtual environments
HEAD_SERVER_PORT = 11000  # NeMo Gym's default; fixed so that it never takes the agent's port
# Ray's object store on the pod's node lives in /dev/shm, an emptyDir of medium Memory sized to hold it
# (Ray's default, 30% of the machine's memory, would not fit and would fall back to disk).
OBJECT_STORE_BYTES = 1 << 30
SHM_SIZE = "2Gi"
# NeMo Gym's vllm_model sends `Authorization: Bearer <policy_api_key>`; the generation server asks for none.
POLICY_API_KEY = "none"

# The container's command, under the image's supervisor. It refuses endpoints of an older attempt than the
# pod's own (a stale rendezvous: `grpojob_trainer.ray_runtime.rendezvous` in shell) and re-reads the mounted copy until
# they are current. `grpojob-servers check` (images/nemo-gym/servers.py) stops the pod at once, with one
# line naming it, when the config names a server the image did not prepare: that line ends the pod's log,
# so its termination message, which EnvironmentsReady quotes. `ray start` joins the job's Ray cluster as a
# node without resources (nothing is scheduled on it) and returns once the raylet runs; NeMo Gym's servers
# then connect through it.
GYM_ARGS = f"+uv_venv_dir={IMAGE_SERVERS_DIR} +skip_venv_if_present=true"
LAUNCH_SCRIPT = f"""set -eu
cp {CONFIG_DIR}/{CONFIG_FILE} {CONFIG_FILE}
grpojob-servers check {GYM_ARGS}
if [ "$GRPOJOB_ATTEMPT" -lt "$GRPOJOB_POD_ATTEMPT" ]; then
  echo "refusing $GRPOJOB_NAME-endpoints of attempt $GRPOJOB_ATTEMPT: this pod belongs to attempt \
$GRPOJOB_POD_ATTEMPT (GRPOJOB_POD_ATTEMPT), and an older attempt's addresses may be a failed run's; \
re-reading {contract.ENDPOINTS_MOUNT}" >&2
  until [ "$(cat {contract.ENDPOINTS_MOUNT}/GRPOJOB_ATTEMPT 2>/dev/null || echo 0)" -ge "$GRPOJOB_POD_ATTEMPT" ]; do
    sleep 2
  done
  RAY_GCS_ADDRESS="$(cat {contract.ENDPOINTS_MOUNT}/RAY_GCS_ADDRESS)"
fi
ray start --address="$RAY_GCS_ADDRESS" --num-cpus=0 --num-gpus=0 --object-store-memory={OBJECT_STORE_BYTES} \
  --disable-usage-stats
exec gym env start {GYM_ARGS}
"""
COMMAND = ["grpojob-supervise", "/bin/bash", "-c", LAUNCH_SCRIPT]


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
        "policy_base_url": endpoints[contract.POLICY_BASE_URL],
        "policy_api_key": POLICY_API_KEY,
        "policy_model_name": job.spec.model.served_model_name,
        "ray_head_node_address": endpoints[contract.RAY_GCS_ADDRESS],
        "default_host": "127.0.0.1",
        "head_server": {"host": "127.0.0.1", "port": HEAD_SERVER_PORT},
        gym.agent: {"responses_api_agents": {gym.agent_server: {"host": "0.0.0.0", "port": env.port}}},
    }
    merged = deep_merge(gym.overrides, owned)
    return {key: merged[key] for key in owned} | merged  # the operator's keys first, for whoever reads it


def config_yaml(config: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(config), sort_keys=False)


def config_hash(config_text: str, endpoints: Mapping[str, str], head_pod: str) -> str:
    """What the environment's pods must be restarted for: their config, or a new Ray head, whose cluster the
    running raylet and servers are not part of. A new head is a new head pod (KubeRay names each one anew),
    whether or not it got a new IP (``RAY_HEAD_POD_IP`` of the endpoints)."""
    digest = hashlib.sha256(config_text.encode())
    digest.update(b"\0" + endpoints.get(contract.RAY_HEAD_POD_IP, "").encode() + b"\0" + head_pod.encode())
    return digest.hexdigest()[:16]


def build_nemo_gym_config_map(job: api.GRPOJob, env: api.EnvironmentSpec, endpoints: dict[str, str]) -> Manifest:
    """The NeMo Gym config of environment ``env`` (see `render_config`), from the endpoints' data."""
    job_name, _ = job_ref(job)
    name = names.ChildNames(job_name).nemo_gym_config(env.name)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(job, name, "environment", environment_selector(job, env)),
        "data": {CONFIG_FILE: config_yaml(render_config(job, env, endpoints))},
    }


def build_nemo_gym_deployment(
    job: api.GRPOJob, env: api.EnvironmentSpec, settings: OperatorSettings, endpoint_data: dict[str, str], head_pod: str
) -> Manifest:
    """Deployment of a NeMo Gym environment: each pod joins the job's Ray cluster as a node without
    resources, then runs `ng_run` with the config of `build_nemo_gym_config_map`; the agent serves `/run`
    on the environment's port. The pod template carries a hash of the config and the Ray head, so a new
    head (or config) rolls the pods. Read-only root: Ray and NeMo Gym write to emptyDirs only."""
    job_name, _ = job_ref(job)
    config_text = config_yaml(render_config(job, env, endpoint_data))
    server: Manifest = {
        "name": "nemo-gym",
        "image": env.image or settings.nemo_gym_image,
        "command": COMMAND,
        "workingDir": WORK_DIR,
        "env": [*ray_auth_env(job), {"name": "HOME", "value": WORK_DIR}],
    }
    volumes = [
        {"name": "config", "configMap": {"name": names.ChildNames(job_name).nemo_gym_config(env.name)}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
    ]
    mounts = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": WORK_DIR},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    annotations = {names.NEMO_GYM_CONFIG_HASH_ANNOTATION: config_hash(config_text, endpoint_data, head_pod)}
    # The attempt of the endpoints the config was rendered from: a new head rolls the pods.
    attempt = int(endpoint_data[contract.GRPOJOB_ATTEMPT])
    return environment_deployment(job, env, attempt, server, volumes, mounts, annotations)
