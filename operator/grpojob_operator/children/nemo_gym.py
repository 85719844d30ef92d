"""NeMo Gym environments: the ConfigMap of the config `gym env start` reads, and the Deployment that runs it.

A NeMo Gym environment (`spec.environments[].nemoGym`) runs NeMo Gym's own servers: the resources
servers and agent of its `configPaths`, and the model server `policy_model`, which the operator points
at the job's generation Service. The config is rendered by `grpojob_api.nemo_gym` (as `grpojob run`
renders it); here it is placed: the generation Service, the job's Ray cluster, the agent on the
environment's port. NeMo Gym's servers join the job's Ray cluster at `ray_head_node_address`, through the
raylet the pod starts first as a node without resources (a Ray driver needs a raylet on its own node, as
the trainer pod does).

The pod runs the NeMo Gym image (`images/nemo-gym/`): `grpojob-supervise` turns the pod's SIGTERM into
SIGINT for every server (NeMo Gym stops only on KeyboardInterrupt), and each server this image
prepares has its virtual environment under `grpojob_api.nemo_gym.IMAGE_SERVERS_DIR`, so nothing installs
at start; one it did not prepare stops the pod before anything starts (`grpojob-servers check`).

Pure functions: the config's placement, and the ConfigMap and the Deployment that carry it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from grpojob_api import endpoints as contract
from grpojob_api import nemo_gym as gym
from grpojob_api import v1alpha1 as api
from grpojob_api.nemo_gym import CONFIG_DIR, CONFIG_FILE, WORK_DIR, config_yaml
from grpojob_operator import names
from grpojob_operator.children.environments import environment_deployment, environment_selector
from grpojob_operator.children.meta import Manifest, job_ref, metadata
from grpojob_operator.children.raycluster import ray_auth_env
from grpojob_operator.settings import OperatorSettings

# Ray's object store on the pod's node lives in /dev/shm, an emptyDir of medium Memory sized to hold it
# (Ray's default, 30% of the machine's memory, would not fit and would fall back to disk).
OBJECT_STORE_BYTES = 1 << 30
SHM_SIZE = "2Gi"
# The container's command, under the image's supervisor. It refuses endpoints of an older attempt than the
# pod's own (a stale rendezvous: `grpojob_trainer.cluster.rendezvous` in shell) and re-reads the mounted copy until
# they are current. `grpojob-servers check` (images/nemo-gym/servers.py) stops the pod at once, with one
# line naming it, when the config names a server the image did not prepare: that line ends the pod's log,
# so its termination message, which EnvironmentsReady quotes. `ray start` joins the job's Ray cluster as a
# node without resources (nothing is scheduled on it) and returns once the raylet runs; NeMo Gym's servers
# then connect through it.
BEFORE_START = f"""if [ "$GRPOJOB_ATTEMPT" -lt "$GRPOJOB_POD_ATTEMPT" ]; then
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
"""
LAUNCH_SCRIPT = gym.launch_script(BEFORE_START)
COMMAND = gym.launch_command(BEFORE_START)


def render_config(job: api.GRPOJob, env: api.EnvironmentSpec, endpoints: Mapping[str, str]) -> dict[str, Any]:
    """NeMo Gym's config for environment ``env`` in the job's pods, from the data of `<job>-endpoints`: the
    generation Service as the policy, the job's Ray cluster, the agent on all interfaces at the
    environment's port (its Service sends `/run` there)."""
    placement = gym.NemoGymPlacement(
        policy_base_url=endpoints[contract.POLICY_BASE_URL],
        ray_head_node_address=endpoints[contract.RAY_GCS_ADDRESS],
        agent_host="0.0.0.0",
        agent_port=env.port,
    )
    return gym.render_config(job, env, placement)


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
