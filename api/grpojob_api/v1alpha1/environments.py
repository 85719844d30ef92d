"""Environments: `spec.environments`, the servers speaking NeMo Gym's protocol (our own, reward functions from the
user's file, or NeMo Gym's servers started by `ng_run`), with their containers' resources and environment
variables.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from grpojob_api.quantity import held_as_int64, parse_quantity
from grpojob_api.v1alpha1.base import (
    MAX_ENV_VARS,
    MAX_PATH_LENGTH,
    ApiModel,
    DnsLabel,
    PvcSource,
    Quantity,
    SecretKeyRef,
    cel,
    cel_rules,
    given,
)


class EnvVar(ApiModel):
    """An environment variable: a literal value or a key of a Secret (never a secret in plain text)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel("has(self.value) != has(self.secretKeyRef)", "set exactly one of value or secretKeyRef")
        )
    )

    name: str = Field(min_length=1, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    value: str | None = None
    secret_key_ref: SecretKeyRef | None = None
    """Take the value from a Secret."""

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if (self.value is None) == (self.secret_key_ref is None):
            raise ValueError(f"env {self.name}: set exactly one of value or secretKeyRef")
        return self


RESOURCE_NAMES = ("cpu", "memory", "ephemeral-storage", "nvidia.com/gpu")
GPU_RESOURCE = "nvidia.com/gpu"
_KNOWN_RESOURCES = "resource names are " + ", ".join(RESOURCE_NAMES)
_WHOLE_RESOURCES = "memory and ephemeral-storage are whole bytes, nvidia.com/gpu whole GPUs"
_REQUESTS_WITHIN_LIMITS = "requests must not exceed limits"
_GPU_REQUEST_IS_LIMIT = "a request of nvidia.com/gpu needs the same limit (GPUs are not overcommitted)"


ResourceList = Annotated[
    dict[str, Quantity],
    Field(
        max_length=len(RESOURCE_NAMES),
        json_schema_extra=cel_rules(
            cel("self.all(k, k in [" + ", ".join(f"'{n}'" for n in RESOURCE_NAMES) + "])", _KNOWN_RESOURCES),
            cel("self.all(k, k == 'cpu' || !isQuantity(self[k]) || quantity(self[k]).isInteger())", _WHOLE_RESOURCES),
        ),
    ),
]
"""Quantities by resource name, as in a container's `resources`."""


class Resources(ApiModel):
    """Container resource requests and limits (Kubernetes quantities) of cpu, memory, ephemeral-storage
    and nvidia.com/gpu."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                given("requests", "limits")
                + "self.requests.all(k, !(k in self.limits) || !isQuantity(self.requests[k]) || "
                "!isQuantity(self.limits[k]) || quantity(self.requests[k]).compareTo(quantity(self.limits[k])) <= 0)",
                _REQUESTS_WITHIN_LIMITS,
                ".requests",
            ),
            cel(
                given("requests", "limits")
                + f"(!('{GPU_RESOURCE}' in self.requests) || ('{GPU_RESOURCE}' in self.limits && "
                f"(!isQuantity(self.requests['{GPU_RESOURCE}']) || !isQuantity(self.limits['{GPU_RESOURCE}']) || "
                f"quantity(self.requests['{GPU_RESOURCE}']).compareTo(quantity(self.limits['{GPU_RESOURCE}'])) == 0)))",
                _GPU_REQUEST_IS_LIMIT,
                ".requests",
            ),
        )
    )

    requests: ResourceList = Field(default_factory=dict)
    limits: ResourceList = Field(default_factory=dict)

    @field_validator("requests", "limits")
    @classmethod
    def _known_whole_quantities(cls, quantities: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(quantities) - set(RESOURCE_NAMES))
        if unknown:
            raise ValueError(f"{_KNOWN_RESOURCES}, not {', '.join(unknown)}")
        # As the API server's `isInteger()` judges it (`held_as_int64`): `1Pi` is whole, but not to it.
        fractional = sorted(k for k, v in quantities.items() if k != "cpu" and not held_as_int64(v))
        if fractional:
            raise ValueError(f"{_WHOLE_RESOURCES}: {', '.join(fractional)}")
        return quantities

    @model_validator(mode="after")
    def _requests_within_limits(self) -> Resources:
        for name, request in self.requests.items():
            limit = self.limits.get(name)
            if limit is not None and parse_quantity(request) > parse_quantity(limit):
                raise ValueError(f"{_REQUESTS_WITHIN_LIMITS} ({name}: {request} > {limit})")
        gpus = self.requests.get(GPU_RESOURCE)
        if gpus is not None and (
            GPU_RESOURCE not in self.limits or parse_quantity(gpus) != parse_quantity(self.limits[GPU_RESOURCE])
        ):
            raise ValueError(_GPU_REQUEST_IS_LIMIT)
        return self


NEMO_GYM_POLICY_MODEL_CONFIG = "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"
# Top-level keys of NeMo Gym's config that the operator sets from the job (and that overrides may not).
NEMO_GYM_OPERATOR_KEYS = (
    "config_paths",
    "policy_base_url",
    "policy_api_key",
    "policy_model_name",
    "ray_head_node_address",
    "head_server",
    "default_host",
)
_NO_PARENT_IN_PACKAGE = "must not contain `..` (a path in the nemo-gym package)"
NemoGymConfigPath = Annotated[
    str,
    StringConstraints(pattern=r"^[^/].*\.ya?ml$", min_length=1, max_length=512),
    # The API server's copy of `NemoGymSpec._inside_the_package`.
    Field(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "!self.matches('(^|/)[.][.](/|$)')", "message": _NO_PARENT_IN_PACKAGE}
            ]
        }
    ),
]


class NemoGymSpec(ApiModel):
    """A NeMo Gym environment: NeMo Gym's own servers (resources servers, an agent, the policy model
    server), started by `ng_run` in the environment pods, joined to the job's Ray cluster."""

    config_paths: list[NemoGymConfigPath] = Field(min_length=1, max_length=32)
    """NeMo Gym config files, by their path in the nemo-gym package, as `ng_run` takes them in
    `config_paths` (e.g. `resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml`):
    the resources servers and the agent."""
    agent: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")
    """The agent server instance (a top-level key of those configs) that the trainer's `/run` calls go
    to; dataset rows name it in `agent_ref.name` (the environment's `name` routes there too)."""
    agent_server: str = Field(default="simple_agent", min_length=1, max_length=253, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """The agent's server implementation (its key under `responses_api_agents`), where its host and port
    are pinned to the environment's `port`."""
    policy_model_config_path: NemoGymConfigPath = NEMO_GYM_POLICY_MODEL_CONFIG
    """Config of the model server instance `policy_model` that the agents call; it is pointed at the
    job's generation servers (`policy_base_url`, `policy_model_name`)."""
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        # Kept as written. No CEL twin of `_no_operator_keys`: the API server compiles no rule over an object of
        # unknown fields, so the operator refuses such a job (InvalidSpec, naming the field).
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    """NeMo Gym config merged over the config files, as `ng_run`'s command-line overrides would be (for
    example `{example_single_tool_call_simple_agent: {responses_api_agents: {simple_agent: {max_steps: 4}}}}`).
    The keys the operator sets from the job (`policy_base_url`, `ray_head_node_address`, ...) are refused."""

    @field_validator("config_paths", "policy_model_config_path")
    @classmethod
    def _inside_the_package(cls, paths: list[str] | str) -> list[str] | str:
        for path in [paths] if isinstance(paths, str) else paths:
            if ".." in path.split("/"):
                raise ValueError(f"{path!r} {_NO_PARENT_IN_PACKAGE}")
        return paths

    @field_validator("overrides")
    @classmethod
    def _no_operator_keys(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        taken = sorted(set(overrides) & set(NEMO_GYM_OPERATOR_KEYS))
        if taken:
            raise ValueError(f"{taken} are set by the operator from the job and cannot be overridden")
        return overrides


REWARD_BUILTINS = ("math", "format", "code")
_REWARDS_RUN_THE_REWARD_SERVER = "command, args and nemoGym must be unset with rewards (the pods run the reward server)"
_ONE_FUNCTION_KIND = "set exactly one of name (a function of the reward file) or builtin (math, format or code)"
_NAMED_FUNCTIONS_NEED_A_FILE = "functions that name a function of the reward file need path or configMap"
_REWARD_PVC_NEEDS_PATH = "pvc needs path (the reward file inside the claim)"
_REWARD_PVC_OR_CONFIG_MAP = "set pvc or configMap, not both"
_FUNCTION_LABELS_DIFFER = "each function appears once (by name, or by builtin)"


class RewardFunction(ApiModel):
    """One reward function: a function of the reward file (`name`) or a built-in verifier (`builtin`), with its
    weight in the sum (TRL's `reward_weights`). It is called as TRL calls a reward function: `prompts`,
    `completions` and the row's other columns as keyword arguments, one list entry per completion; it returns
    one number per completion, or None where it does not apply. `async def` works too."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(cel("has(self.name) != has(self.builtin)", _ONE_FUNCTION_KIND))
    )

    name: str | None = Field(default=None, min_length=1, max_length=253, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """The function's name in the reward file; its reward is logged as `reward/<name>/mean`."""
    builtin: Literal["math", "format", "code"] | None = None
    """A built-in verifier: `math` (the completion's final answer equals the row's `expected_answer` by value,
    with math-verify: `\\boxed{}`, `####`, fractions, LaTeX), `format` (`<think>…</think><answer>…</answer>`)
    or `code` (the completion's code passes the row's `tests`, run in a sandbox without network). Logged as
    `reward/<builtin>/mean`."""
    weight: float = Field(default=1.0, ge=-1_000_000, le=1_000_000)
    """The function's weight: a rollout's reward is the weighted sum of the functions that apply to its row."""

    @model_validator(mode="after")
    def _one_kind(self) -> RewardFunction:
        if (self.name is None) == (self.builtin is None):
            raise ValueError(_ONE_FUNCTION_KIND)
        return self

    @property
    def label(self) -> str:
        """The name the function's reward is reported under: its own, or the built-in's."""
        return self.name or str(self.builtin)


class CodeSandbox(ApiModel):
    """The limits of each program the `code` verifier runs (the completion's code and one of the row's tests)."""

    cpu_seconds: int = Field(default=10, ge=1, le=600)
    """CPU time of the program; past it the program is killed and its test fails."""
    memory_mb: int = Field(default=512, ge=64, le=65536)
    """Address space of the program in MiB; an allocation past it fails."""


class RewardFileConfigMap(ApiModel):
    """The reward file as a key of a ConfigMap (`kubectl create configmap NAME --from-file=rewards.py`)."""

    name: str = Field(min_length=1, max_length=253)
    """ConfigMap in the GRPOJob's namespace."""
    key: str | None = Field(default=None, min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """The key holding the file (default: the file name of `path`)."""


class RewardsSpec(ApiModel):
    """Reward functions from a Python file, no image to build: the environment's pods (the operator's
    environment image) import the file and score each rollout with the weighted sum of `functions`. The file is
    `path` under `grpojob run`; on Kubernetes, the key of `configMap` (mounted at `/etc/grpojob-rewards/`), or
    `path` inside `pvc`, or else `path` in the image. User code runs only in the environment's pods."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel("!has(self.pvc) || has(self.path)", _REWARD_PVC_NEEDS_PATH, ".pvc"),
            cel("!has(self.pvc) || !has(self.configMap)", _REWARD_PVC_OR_CONFIG_MAP, ".pvc"),
            cel("has(self.path) || has(self.configMap) || self.functions.all(f, !has(f.name))",
                _NAMED_FUNCTIONS_NEED_A_FILE, ".functions"),
            cel("self.functions.all(f, self.functions.exists_one(g, has(f.name) ? (has(g.name) && g.name == f.name) : "
                "(has(g.builtin) && g.builtin == f.builtin)))", _FUNCTION_LABELS_DIFFER, ".functions"),
            cel("!has(self.configMap) || has(self.configMap.key) || has(self.path)",
                "configMap needs key, or path to take the file name from", ".configMap"),
        )
    )  # fmt: skip

    path: str | None = Field(default=None, min_length=1, max_length=MAX_PATH_LENGTH)
    """The reward file: a local path under `grpojob run`; on Kubernetes, inside `pvc`, or in the image when
    neither `pvc` nor `configMap` is set."""
    pvc: PvcSource | None = None
    """Claim holding `path`."""
    config_map: RewardFileConfigMap | None = None
    """ConfigMap holding the file (on Kubernetes; `grpojob run` reads `path`)."""
    functions: list[RewardFunction] = Field(min_length=1, max_length=32)
    """The reward functions, summed with their weights."""
    timeout_seconds: int = Field(default=30, ge=1, le=3600)
    """How long one function may take on one rollout; past it the rollout fails, naming the function."""
    workers: int = Field(default=2, ge=1, le=64)
    """Processes in each pod running the functions side by side (each imports the file once)."""
    sandbox: CodeSandbox = Field(default_factory=CodeSandbox)
    """Limits of the `code` verifier's programs."""

    @model_validator(mode="after")
    def _consistent(self) -> RewardsSpec:
        if self.pvc is not None and self.path is None:
            raise ValueError(_REWARD_PVC_NEEDS_PATH)
        if self.pvc is not None and self.config_map is not None:
            raise ValueError(_REWARD_PVC_OR_CONFIG_MAP)
        if self.path is None and self.config_map is None and any(f.name is not None for f in self.functions):
            raise ValueError(_NAMED_FUNCTIONS_NEED_A_FILE)
        labels = [function.label for function in self.functions]
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        if repeated:
            raise ValueError(f"{_FUNCTION_LABELS_DIFFER}: {', '.join(repeated)} more than once")
        if self.config_map is not None and self.config_map.key is None and self.path is None:
            raise ValueError("configMap needs key, or path to take the file name from")
        return self

    @property
    def config_map_key(self) -> str | None:
        """The ConfigMap's key holding the file: `configMap.key`, else the file name of `path`."""
        if self.config_map is None:
            return None
        return self.config_map.key or str(self.path).rstrip("/").rsplit("/", 1)[-1]


class EnvironmentSpec(ApiModel):
    """One environment server speaking NeMo Gym's protocol: agent `/run`, `/seed_session`, `/verify`."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.nemoGym) || ((!has(self.command) || size(self.command) == 0) && "
                    "(!has(self.args) || size(self.args) == 0))",
                    "message": "command and args must be empty with nemoGym (the pods run ng_run)",
                },
                cel(
                    "!has(self.rewards) || (!has(self.nemoGym) && (!has(self.command) || size(self.command) == 0) "
                    "&& (!has(self.args) || size(self.args) == 0))",
                    _REWARDS_RUN_THE_REWARD_SERVER,
                ),
            ]
        }
    )

    name: DnsLabel
    """Environment name: the `agent_ref.name` of the dataset rows it serves, and part of child names."""
    image: str | None = None
    """Container image (default: the operator's environment image)."""
    command: list[str] = Field(default_factory=list)
    """Entrypoint; the same command runs as a local process under `grpojob run`."""
    args: list[str] = Field(default_factory=list)
    """Arguments to the entrypoint."""
    replicas: int = Field(default=1, ge=1, le=1024)
    """Pods serving this environment behind one Service; under `grpojob run`, that many local processes
    (the driver spreads rollouts over them)."""
    port: int = Field(default=8080, ge=1024, le=65535)
    """Port the server listens on."""
    resources: Resources = Field(default_factory=Resources)
    """Requests and limits of each pod."""
    env: list[EnvVar] = Field(default_factory=list, max_length=MAX_ENV_VARS)
    """Extra environment variables."""
    nemo_gym: NemoGymSpec | None = None
    """Run NeMo Gym's own servers (`ng_run`) instead of `command`: the pods run the NeMo Gym
    image, join the job's Ray cluster and serve the agent on `port`. `command` and `args` stay empty."""

    rewards: RewardsSpec | None = None
    """Score rollouts with Python reward functions (a file of yours and the built-in verifiers) instead of
    `command`: the pods run the environment image's reward server. `command`, `args` and `nemoGym` stay unset."""

    @model_validator(mode="after")
    def _nemo_gym_runs_ng_run(self) -> EnvironmentSpec:
        if self.nemo_gym is not None and (self.command or self.args):
            raise ValueError(
                f"environment {self.name}: command and args must be empty with nemoGym (the pods run ng_run)"
            )
        if self.rewards is not None and (self.nemo_gym is not None or self.command or self.args):
            raise ValueError(f"environment {self.name}: {_REWARDS_RUN_THE_REWARD_SERVER}")
        return self
