"""What the operator tells the pods of a GRPOJob (and `grpojob run` its processes): the
`<job>-endpoints` ConfigMap, the other environment variables the pods read, the ports and the Ray
resource names.

The operator writes with this module (`grpojob_operator.children.endpoints`); the trainer and the environment
servers read with it (`grpojob_trainer.cli`, `grpojob_trainer.environments.__main__`), so a key exists
once, and a pod that misses one says which.

`<job>-endpoints` is written once the Ray head is really up, and every pod of the job takes it through
`envFrom`: each key is an environment variable. Its data, for a job `demo` in namespace `rl`:

    RAY_GCS_ADDRESS    demo-head-svc.rl.svc.cluster.local:6379
    RAY_HEAD_POD_IP    10.0.0.7
    RAY_DASHBOARD_URL  http://demo-head-svc.rl.svc.cluster.local:8265
    POLICY_BASE_URL    http://demo-generation.rl.svc.cluster.local:8000/v1
    PENGUIN_ENV_URLS   {"math": "http://demo-env-math.rl.svc.cluster.local:8080"}
    GRPOJOB_NAME       demo
    GRPOJOB_ATTEMPT    1
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# ------------------------------------------------------------------------------------------------
# ports

GCS_PORT = 6379
"""Ray's GCS on the head (KubeRay's default)."""
DASHBOARD_PORT = 8265
"""Ray's dashboard on the head."""
RAY_CLIENT_PORT = 10001
"""Ray Client on the head."""
GENERATION_PORT = 8000
"""The OpenAI-compatible generation server on each `generation` worker, and the generation Service's port."""
TRAINER_METRICS_PORT = 9090
"""The trainer's Prometheus endpoint `/metrics` (its per-step training metrics), the container port `metrics`."""
TENSORBOARD_PORT = 6006
"""TensorBoard (`spec.logging.tensorboard`), and the `<job>-tensorboard` Service's port."""

# ------------------------------------------------------------------------------------------------
# Ray worker groups and resources

GENERATION_GROUP = "generation"
"""The RayCluster's worker group of generation engines. Each group's pods declare a custom Ray resource
named after the group, which the trainer asks for to place its actors on them."""
POLICY_GROUP = "policy"
"""The RayCluster's worker group of policy-training ranks (one unit of its resource per rank)."""
COLOCATED_GROUP = "colocated"
"""The RayCluster's one worker group of a colocated job (`spec.placement: colocated`): each pod holds a
policy rank and an engine beside it on the same GPU, and declares one unit of both groups' resources."""

# ------------------------------------------------------------------------------------------------
# environment variables

RAY_GCS_ADDRESS = "RAY_GCS_ADDRESS"
RAY_HEAD_POD_IP = "RAY_HEAD_POD_IP"
RAY_DASHBOARD_URL = "RAY_DASHBOARD_URL"
POLICY_BASE_URL = "POLICY_BASE_URL"
PENGUIN_ENV_URLS = "PENGUIN_ENV_URLS"
"""The environment servers' base URLs by environment name (a JSON object). The `<job>-endpoints` contract's
historical name for NeMo Gym environment URLs, kept as it is: pods and environment images read it."""
GRPOJOB_NAME = "GRPOJOB_NAME"
GRPOJOB_ATTEMPT = "GRPOJOB_ATTEMPT"
GRPOJOB_POD_ATTEMPT = "GRPOJOB_POD_ATTEMPT"
"""Set by the operator on every pod that reads `<job>-endpoints`: the attempt the pod was made for. A pod
refuses endpoints written for an older attempt (a stale rendezvous) and re-reads them instead."""
ENDPOINTS_MOUNT = "/etc/grpojob-endpoints"
"""Where `<job>-endpoints` is also mounted as files (one per key): the kubelet keeps them current, while
``envFrom`` is fixed when the container starts, so this is where a refused copy is re-read."""

# ------------------------------------------------------------------------------------------------
# Ray token authentication

RAY_AUTH_MODE = "RAY_AUTH_MODE"
"""Ray's switch for token authentication; `token` in every pod of a job."""
RAY_AUTH_MODE_TOKEN = "token"
RAY_AUTH_TOKEN = "RAY_AUTH_TOKEN"
"""The job's Ray token, from the Secret KubeRay creates for the RayCluster (named like it)."""
RAY_AUTH_TOKEN_SECRET_KEY = "auth_token"
"""The key of that Secret holding the token (KubeRay's `RAY_AUTH_TOKEN_SECRET_KEY`)."""

PORT = "PORT"
"""Environment servers: the port to listen on."""
HOST = "HOST"
"""Environment servers: the address to listen on (all by default)."""
POLICY_MODEL_NAME = "POLICY_MODEL_NAME"
"""Environment servers: the ``model`` to ask the generation server for."""
RESOURCES_URL = "RESOURCES_URL"
"""Environment servers: a resources server other than themselves (optional)."""
SESSION_SECRET = "SESSION_SECRET"
"""Environment servers: the key that signs session cookies (optional; a random one per process otherwise,
which is enough while each environment's agent and resources routes share one process)."""

GRPOJOB_PROGRESS_CONFIGMAP = "GRPOJOB_PROGRESS_CONFIGMAP"
GRPOJOB_MODEL_PATH = "GRPOJOB_MODEL_PATH"
GRPOJOB_DATASET_PATH = "GRPOJOB_DATASET_PATH"
GRPOJOB_EVALUATION_DATASET_PATH = "GRPOJOB_EVALUATION_DATASET_PATH"
GRPOJOB_CHECKPOINT_DIR = "GRPOJOB_CHECKPOINT_DIR"
GRPOJOB_LOG_DIR = "GRPOJOB_LOG_DIR"
GRPOJOB_OUTPUT_DIR = "GRPOJOB_OUTPUT_DIR"
"""The trainer: where the policy's ranks write the exported model (`spec.output`), as they see it."""

HF_HUB_OFFLINE = "HF_HUB_OFFLINE"
"""`huggingface_hub`'s switch: "1" on every pod of a job after its model's download (and in the download
itself with `spec.model.offline`): nothing reaches for the hub."""
HF_HUB_CACHE = "HF_HUB_CACHE"
"""`huggingface_hub`'s cache directory: the mounted cache volume of a job whose model is a hub id."""
HF_TOKEN = "HF_TOKEN"
"""The download step: the Hugging Face token, from `spec.model.tokenSecret`."""
GRPOJOB_TRAINER_METRICS_PORT = "GRPOJOB_TRAINER_METRICS_PORT"
POD_NAMESPACE = "POD_NAMESPACE"
"""The trainer: its namespace (the downward API's ``metadata.namespace``)."""


class ContractError(ValueError):
    """What a pod was given does not hold what this module says it must; the message names each key."""


def _read(model: type[BaseModel], data: Mapping[str, str], what: str) -> Any:
    """Validate ``data`` (a ConfigMap's data or a process environment) into ``model``; errors name the key."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as error:
        problems = []
        for problem in error.errors():
            key = ".".join(str(part) for part in problem["loc"])
            problems.append(f"{key} is missing" if problem["type"] == "missing" else f"{key}: {problem['msg']}")
        raise ContractError(f"{what}: {'; '.join(problems)}") from None


class _Contract(BaseModel):
    """Fields named by their environment variable (the alias); constructed by field name or by alias."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")


class Endpoints(_Contract):
    """The data of `<job>-endpoints`: where everything of the job is, and which attempt this is."""

    ray_gcs_address: str = Field(alias=RAY_GCS_ADDRESS, min_length=1)
    """``host:port`` of the Ray head's GCS, through the head's Service."""
    ray_head_pod_ip: str = Field(alias=RAY_HEAD_POD_IP, min_length=1)
    """The head pod's IP when this was written: a new IP means a new head, so the operator rewrites it."""
    ray_dashboard_url: str = Field(alias=RAY_DASHBOARD_URL, min_length=1)
    policy_base_url: str = Field(alias=POLICY_BASE_URL, min_length=1)
    """OpenAI base URL (ends in ``/v1``) of the generation Service."""
    environment_urls: dict[str, str] = Field(alias=PENGUIN_ENV_URLS)
    """Base URL of each environment's Service, by environment name (a JSON object in the ConfigMap)."""
    job_name: str = Field(alias=GRPOJOB_NAME, min_length=1)
    attempt: int = Field(alias=GRPOJOB_ATTEMPT, ge=1)
    """The trainer attempt these endpoints were written for (1, 2, … as the operator retries)."""

    @field_validator("environment_urls", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError as error:
                raise ValueError(f"not JSON: {error}") from None
        return value

    def data(self) -> dict[str, str]:
        """The ConfigMap's data: every value a string, objects as JSON with sorted keys."""
        dumped = self.model_dump(mode="json", by_alias=True)
        return {
            key: value if isinstance(value, str) else json.dumps(value, sort_keys=True) for key, value in dumped.items()
        }

    @classmethod
    def from_data(cls, data: Mapping[str, str]) -> Endpoints:
        """Read the ConfigMap's data, or a pod's environment (which holds it through ``envFrom``); raises
        `ContractError` naming every missing or malformed key."""
        return _read(cls, data, "the <job>-endpoints ConfigMap")


def pod_attempt(environ: Mapping[str, str]) -> int | None:
    """The pod's own attempt (`GRPOJOB_POD_ATTEMPT`), or None where the operator set none (`grpojob run`)."""
    value = environ.get(GRPOJOB_POD_ATTEMPT)
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ContractError(f"{GRPOJOB_POD_ATTEMPT}: must be a whole number >= 1, not {value!r}")
    return int(value)


def stale(found: Endpoints, own_attempt: int | None) -> str | None:
    """Why ``found`` must not be used by a pod of ``own_attempt`` (one line), or None when it may be: the
    endpoints were written for an older attempt, so their addresses may be a failed run's."""
    if own_attempt is None or found.attempt >= own_attempt:
        return None
    return (
        f"refusing {found.job_name}-endpoints of attempt {found.attempt}: this pod belongs to attempt "
        f"{own_attempt} ({GRPOJOB_POD_ATTEMPT}), and an older attempt's addresses may be a failed run's"
    )


class TrainerEnv(_Contract):
    """The environment variables of the trainer pod besides the endpoints: where its files are inside it,
    and the ConfigMap it reports progress to."""

    progress_config_map: str = Field(alias=GRPOJOB_PROGRESS_CONFIGMAP, min_length=1)
    model_path: str = Field(alias=GRPOJOB_MODEL_PATH, min_length=1)
    dataset_paths: list[Annotated[str, Field(min_length=1)]] = Field(alias=GRPOJOB_DATASET_PATH, min_length=1)
    """Where each source of `spec.dataset` is, in its order: a JSONL file, or a hub dataset's snapshot directory.
    One source's is the path itself, several sources' a JSON list."""
    evaluation_dataset_path: str | None = Field(default=None, alias=GRPOJOB_EVALUATION_DATASET_PATH, min_length=1)
    """The held-out rows of `spec.evaluation` (none without an evaluation): a file or a snapshot directory."""
    checkpoint_dir: str = Field(alias=GRPOJOB_CHECKPOINT_DIR, min_length=1)
    output_dir: str = Field(alias=GRPOJOB_OUTPUT_DIR, min_length=1)
    """Where the policy's ranks (on the `policy` workers) write the exported model."""
    log_dir: str = Field(default="/tmp/grpojob", alias=GRPOJOB_LOG_DIR, min_length=1)
    """This attempt's run directory: `metrics.jsonl`, TensorBoard events, offline W&B runs (inside the pod)."""
    metrics_port: int = Field(default=0, alias=GRPOJOB_TRAINER_METRICS_PORT, ge=0, le=65535)
    """Port of the trainer's Prometheus endpoint (0: none)."""

    @field_validator("dataset_paths", mode="before")
    @classmethod
    def _one_path_or_a_json_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value.startswith("["):
                try:
                    return json.loads(value)
                except json.JSONDecodeError as error:
                    raise ValueError(f"not a JSON list: {error}") from None
            return [value]
        return value

    def env(self) -> list[dict[str, str]]:
        """The container's ``env`` entries."""
        values = self.model_dump(by_alias=True, exclude_none=True)
        paths = values[GRPOJOB_DATASET_PATH]
        one = len(paths) == 1 and not paths[0].startswith("[")
        values[GRPOJOB_DATASET_PATH] = paths[0] if one else json.dumps(paths)
        return [{"name": key, "value": str(value)} for key, value in values.items()]

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> TrainerEnv:
        """Read the trainer pod's environment; raises `ContractError` naming every missing key."""
        return _read(cls, environ, "the trainer pod's environment")
