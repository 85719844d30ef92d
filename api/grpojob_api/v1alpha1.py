"""The GRPOJob API, `grpo.dev/v1alpha1`: the one source of truth for the CRD, the operator and the trainer.

Field names are camelCase on the wire (as in every Kubernetes API) and snake_case in Python. Every
field has a docstring; it becomes the CRD's OpenAPI description, so `kubectl explain grpojob.spec`
shows it. Constraints live in ``Field(...)``; every rule that JSON Schema cannot say is a validator
here and, beside it, the same rule in CEL (`cel(...)`) that the generated CRD (`grpojob_api.crd`)
carries, so `kubectl apply` refuses at once what the operator and the trainer would refuse later.

This module holds the types only: `grpojob_api.admission` parses a manifest into them as the API server
admits it, `grpojob_api.paths` says where a job's files go.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from grpojob_api.quantity import held_as_int64, parse_quantity

GROUP = "grpo.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "GRPOJob"
PLURAL = "grpojobs"
SINGULAR = "grpojob"
SHORT_NAMES = ("grpo",)

# KubeRay derives pod and Service names from the RayCluster name and caps it at 53 characters; the
# longest child name we derive is `<job>-env-<environment>` (a Service: a DNS-1035 label, 63 max).
MAX_JOB_NAME_LENGTH = 40
MAX_ENVIRONMENT_NAME_LENGTH = 18
DNS_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"

# Longest path inside a volume (Linux's PATH_MAX); strings and lists that CEL rules read are bounded so
# the API server's cost estimate of the rules stays within its budget.
MAX_PATH_LENGTH = 4096
MAX_ENV_VARS = 128
# Longest duration in seconds: an int32, as Kubernetes' own (a Job's ttlSecondsAfterFinished, a Deployment's
# progressDeadlineSeconds), about 68 years; the operator adds these to timestamps.
MAX_SECONDS = 2**31 - 1

DnsLabel = Annotated[str, StringConstraints(pattern=DNS_LABEL, min_length=1, max_length=MAX_ENVIRONMENT_NAME_LENGTH)]


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One CEL rule of the CRD (an `x-kubernetes-validations` entry): the API server's copy of a validator
    beside it. ``message`` says what is wrong as the validator does; ``field_path`` (relative, `.name`)
    is the field the API server names, the object the rule sits on by default."""
    return {"rule": rule, "message": message} | ({"fieldPath": field_path} if field_path else {})


def _given(*fields: str) -> str:
    """A CEL guard: the rule holds where one of ``fields`` is absent. Defaults fill them in every object
    the API server validates, but it also checks the rule on the section's own default, `{}`."""
    return "".join(f"!has(self.{f}) || " for f in fields)


def cel_rules(*rules: dict[str, str]) -> dict[str, Any]:
    """Schema extras carrying CEL rules, for `Field(json_schema_extra=...)` or a model's config."""
    return {"x-kubernetes-validations": list(rules)}


class ApiModel(BaseModel):
    """Base of every API object: camelCase aliases, unknown fields refused, docstrings as descriptions."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=True,
    )


def _stays_inside(where: str) -> tuple[dict[str, Any], AfterValidator]:
    """The CEL rule and the validator refusing a path with a `..` segment, which would leave ``where``."""
    message = f"must not contain `..` (a path inside {where})"

    def check(path: str) -> str:
        if ".." in path.split("/"):
            raise ValueError(f"{path!r} {message}")
        return path

    return cel_rules(cel("!self.matches('(^|/)[.][.](/|$)')", message)), AfterValidator(check)


_IN_VOLUME_RULE, _IN_VOLUME = _stays_inside("the volume")
VolumePath = Annotated[str, Field(max_length=MAX_PATH_LENGTH, json_schema_extra=_IN_VOLUME_RULE), _IN_VOLUME]
"""A path inside a volume: no `..` segment, so it cannot leave the volume."""


def _non_negative_quantity(text: str) -> str:
    if parse_quantity(text) < 0:
        raise ValueError(f"{text!r} must not be negative")
    return text


Quantity = Annotated[
    str,
    Field(
        max_length=64,
        json_schema_extra=cel_rules(
            cel(
                # Kubernetes parses a missing number (`Ki`, `.`, `e3`) as 0; the grammar, and we, want one. A sign
                # is the grammar's too: `-0` is 0, which a container's resources take, as we do.
                "isQuantity(self) && self.matches('^[+-]?([0-9]|[.][0-9])') && "
                "quantity(self).compareTo(quantity('0')) >= 0",
                "must be a non-negative Kubernetes quantity such as 500m, 2Gi, 1e3 or .5",
            )
        ),
    ),
    AfterValidator(_non_negative_quantity),
]
"""A Kubernetes quantity (`500m`, `2Gi`, `1e3`, `.5`), by Kubernetes' grammar."""


# --------------------------------------------------------------------------------------------------
# spec


class PvcSource(ApiModel):
    """A path inside a PersistentVolumeClaim, mounted read-only where it is needed."""

    claim_name: str = Field(min_length=1)
    """Name of the PersistentVolumeClaim in the GRPOJob's namespace."""
    path: VolumePath = Field(default="", pattern=r"^[^/]|^$")
    """Path inside the volume (relative, without `..`; empty for its root)."""


HUB_MODEL_ID = r"^[A-Za-z0-9][-_.A-Za-z0-9]*(/[A-Za-z0-9][-_.A-Za-z0-9]*)?$"
"""A Hugging Face model id: `name` or `owner/name` (letters, digits, `-`, `_`, `.`)."""
_ONE_MODEL_SOURCE = "spec.model: set exactly one of path (a model directory) or id (a Hugging Face model id)"
_MODEL_PVC_NEEDS_PATH = "spec.model.pvc needs spec.model.path (the model directory inside the claim)"
_HUB_FIELDS_NEED_ID = "spec.model: revision, tokenSecret and offline go with id (a Hugging Face model id)"


class ModelCacheSpec(ApiModel):
    """The volume the job's Hugging Face downloads go to (in the hub's cache layout), once per job: the model
    and the datasets named by id share it. A claim the user names (shared by jobs, so a model or dataset is
    downloaded once), or one the job creates and deletes."""

    claim_name: str | None = Field(default=None, min_length=1)
    """An existing PersistentVolumeClaim to use as the cache (ReadWriteMany to share it between nodes). Without
    it the job creates `<job>-model-cache`, which goes with the job."""
    size: Quantity = "64Gi"
    """Size of the claim the job creates (ignored with `claimName`)."""
    storage_class_name: str | None = Field(default=None, min_length=1)
    """StorageClass of the claim the job creates (the cluster's default without it)."""
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany"] = "ReadWriteOnce"
    """Access mode of the claim the job creates: ReadWriteMany when the Ray pods span several nodes."""


class ModelSpec(ApiModel):
    """The policy model: a Hugging Face model directory (weights, config, tokenizer, chat template), named
    one of three ways: a Hugging Face model `id` (downloaded once into a cache volume before any pod needs
    it); a `path` (on a `pvc`) to a model directory; or a `path` to an earlier job's exported model or
    checkpoint, to continue training from it."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel("has(self.path) != has(self.id)", _ONE_MODEL_SOURCE),
            cel("!has(self.pvc) || has(self.path)", _MODEL_PVC_NEEDS_PATH, ".pvc"),
            cel(
                "has(self.id) || !(has(self.revision) || has(self.tokenSecret) || (has(self.offline) && self.offline))",
                _HUB_FIELDS_NEED_ID,
            ),
        )
    )

    path: str | None = Field(default=None, min_length=1, max_length=MAX_PATH_LENGTH)
    """Local path of the model directory (a Hugging Face model directory, an exported model or a checkpoint
    of an earlier job); with `pvc`, the path inside the claim."""
    pvc: PvcSource | None = None
    """Claim holding `path`; mounted read-only into the Ray pods and the trainer."""
    id: str | None = Field(default=None, max_length=96, pattern=HUB_MODEL_ID)
    """A Hugging Face model id (`Qwen/Qwen2.5-1.5B-Instruct`): the operator downloads it into `cache` before
    the Ray pods start, and every pod loads that one revision from there, with `HF_HUB_OFFLINE=1`."""
    revision: str | None = Field(default=None, min_length=1, max_length=255, pattern=r"^[^\s]+$")
    """Branch, tag or commit of `id` (default `main`); resolved to one commit by the download."""
    token_secret: SecretKeyRef | None = None
    """The Secret key holding a Hugging Face token (`HF_TOKEN`), for gated or private models."""
    cache: ModelCacheSpec | None = None
    """The job's Hugging Face cache: where `id`, and the datasets named by id, are downloaded to (default: a
    claim the job creates). Also with a `path` model when a dataset is named by id."""
    offline: bool = False
    """Take `id` from the cache only, never from the hub (a cache filled beforehand, an air-gapped
    cluster): the download step fails with a clear reason when the cache does not hold it."""
    served_model_name: str = Field(default="policy", min_length=1, max_length=128)
    """Name the generation server answers to (`model` in OpenAI requests, `/v1/models`)."""

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.path is None) == (self.id is None):
            raise ValueError(_ONE_MODEL_SOURCE)
        if self.pvc is not None and self.path is None:
            raise ValueError(_MODEL_PVC_NEEDS_PATH)
        hub_fields = self.revision or self.token_secret or self.offline
        if self.id is None and hub_fields:
            raise ValueError(_HUB_FIELDS_NEED_ID)
        return self


class WorkerResources(ApiModel):
    """CPU, memory and shared memory of each Ray worker pod of a group. Each unset field scales with the
    pod's GPUs, so that a one-GPU pod fits a one-GPU node of 8 vCPUs and 32 GiB (a common cloud shape,
    about 7.9 CPUs and 27-30 GiB allocatable) beside the node's own daemons: per GPU 4 CPUs, 24Gi of memory
    and 8Gi of shared memory; a CPU pod gets 2 CPUs, 8Gi and 3Gi."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!has(self.sharedMemory) || !has(self.memory) || !isQuantity(self.sharedMemory) || "
                "!isQuantity(self.memory) || quantity(self.sharedMemory).compareTo(quantity(self.memory)) <= 0",
                "sharedMemory must not exceed memory (the pod's /dev/shm counts against its memory limit)",
                ".sharedMemory",
            ),
        )
    )

    cpu: Quantity | None = None
    """CPUs the pod requests (no CPU limit, so that tokenisation and data loading may use idle cores).
    Default: 4 per GPU, 2 for a CPU pod."""
    memory: Quantity | None = None
    """Memory the pod requests, which is also its limit (Ray sizes its object store from it). Default: 24Gi
    per GPU, 8Gi for a CPU pod. A model loads through host memory: a 7B model's full fine-tune needs more."""
    shared_memory: Quantity | None = None
    """Size of the pod's /dev/shm (memory-backed, counted against `memory`), where Ray keeps its object
    store. Default: 8Gi per GPU, 3Gi for a CPU pod."""

    @model_validator(mode="after")
    def _shared_memory_within_memory(self) -> WorkerResources:
        shm, memory = self.shared_memory, self.memory
        if shm is not None and memory is not None and parse_quantity(shm) > parse_quantity(memory):
            raise ValueError(
                f"sharedMemory must not exceed memory (the pod's /dev/shm counts against its memory limit): "
                f"{shm} > {memory}"
            )
        return self

    def for_gpus(self, gpus: int) -> tuple[str, str, str]:
        """The pod's CPU request, memory (request and limit) and /dev/shm size with ``gpus`` GPUs: the fields
        set, and the defaults for the rest."""
        cpu, memory, shared = ("2", "8Gi", "3Gi") if gpus == 0 else (str(4 * gpus), f"{24 * gpus}Gi", f"{8 * gpus}Gi")
        memory = self.memory or memory
        if self.shared_memory is not None:
            shared = self.shared_memory
        elif parse_quantity(shared) > parse_quantity(memory):
            shared = memory  # /dev/shm counts against the pod's memory: never more than all of it
        return self.cpu or cpu, memory, shared


class GenerationBackend(StrEnum):
    VLLM = "vllm"
    TRANSFORMERS = "transformers"


_VLLM_NEEDS_GPUS = "spec.generation.backend: vllm needs spec.generation.gpusPerReplica of 1 or more"
_NEW_TOKENS_FIT = (
    "spec.generation.maxNewTokens must be smaller than spec.generation.maxModelLen to leave room for the prompt"
)


class GenerationSpec(ApiModel):
    """The generation engines (one per `generation` Ray worker) and the sampling parameters.

    Sampling parameters are enforced on-policy: a request that leaves out temperature or top-p samples with
    these, and one whose temperature or top-p differ is refused.
    """

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                _given("maxNewTokens", "maxModelLen") + "self.maxNewTokens < self.maxModelLen",
                _NEW_TOKENS_FIT,
                ".maxNewTokens",
            ),
            cel(
                _given("backend", "gpusPerReplica") + "(self.backend != 'vllm' || self.gpusPerReplica >= 1)",
                _VLLM_NEEDS_GPUS,
                ".backend",
            ),
        )
    )

    backend: GenerationBackend = GenerationBackend.TRANSFORMERS
    """Engine behind the OpenAI-compatible server: `transformers` (CPU or GPU) or `vllm` (GPUs only)."""
    replicas: int = Field(default=1, ge=1, le=256)
    """Number of generation engines (pods of the `generation` worker group; colocated, one beside each policy
    rank, so as many as `spec.training.replicas`)."""
    gpus_per_replica: int = Field(default=1, ge=0, le=8)
    """GPUs per engine, which is also vLLM's tensor-parallel size (0 runs on CPU)."""
    gpu_memory_utilization: float | None = Field(default=None, gt=0.0, le=1.0)
    """Fraction of GPU memory vLLM may use. Unset: 0.9 on GPUs of its own (`spec.placement: split`), 0.35 on
    a GPU it shares with a policy rank (`colocated`), which leaves the rest to training (the share the 1.5B
    and 7B LoRA benchmarks ran at)."""
    max_model_len: int = Field(default=4096, ge=16, le=1_048_576)
    """Longest prompt plus generation, in tokens."""
    temperature: float = Field(default=1.0, gt=0.0, le=2.0)
    """Sampling temperature used for every rollout; above 0: GRPO trains on sampled rollouts, and greedy
    decoding has no sampling distribution to compute log-probabilities of."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus-sampling top-p used for every rollout."""
    max_new_tokens: int = Field(default=1024, ge=1, le=1_048_576)
    """Most tokens one model call may generate."""
    sleep_while_training: bool | None = None
    """Whether a vLLM engine that shares its GPU with the policy (`spec.placement: colocated`) sleeps while the
    policy trains (vLLM's sleep mode), so training may use the GPU's memory beyond what the engine leaves;
    it wakes for the weight sync. Unset: it sleeps when the policy sends full weights, which replace its own
    (it drops them with its KV cache: the 1.5B step took 0.86 of the time awake on an H200), and stays awake
    for a LoRA adapter (the base it must keep would go to host memory and back: 1.6 s more per 7B step).
    `true` makes a LoRA policy's engine sleep too. No effect on an engine with GPUs of its own."""
    resources: WorkerResources = Field(default_factory=WorkerResources)
    """CPU, memory and shared memory of each `generation` worker pod (split placement; colocated workers
    take `spec.training.resources`)."""

    @model_validator(mode="after")
    def _new_tokens_fit(self) -> GenerationSpec:
        if self.max_new_tokens >= self.max_model_len:
            raise ValueError(f"{_NEW_TOKENS_FIT} ({self.max_new_tokens} >= {self.max_model_len})")
        return self

    @model_validator(mode="after")
    def _vllm_needs_gpus(self) -> GenerationSpec:
        if self.backend == GenerationBackend.VLLM and self.gpus_per_replica == 0:
            raise ValueError(_VLLM_NEEDS_GPUS)
        return self


class OptimizerSpec(ApiModel):
    """AdamW settings."""

    name: Literal["adamw"] = "adamw"
    """Optimizer (AdamW only, for now)."""
    learning_rate: float = Field(default=1e-6, gt=0.0, le=1.0)
    """Peak learning rate."""
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0)
    """Decoupled weight decay."""
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    beta2: float = Field(default=0.999, ge=0.0, lt=1.0)
    max_grad_norm: float = Field(default=1.0, gt=0.0)
    """Gradients are clipped to this global L2 norm."""


LORA_MODULE_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
"""A module's own name (the last part of its dotted path, `q_proj`), as `peft`'s `target_modules` takes it."""


ModuleNames = Annotated[
    list[Annotated[str, StringConstraints(pattern=LORA_MODULE_NAME, max_length=128)]],
    Field(min_length=1, max_length=64, json_schema_extra={"x-kubernetes-list-type": "set"}),
]
"""Module names, each once (a set: the API server refuses a name twice)."""


class LoraSpec(ApiModel):
    """Train a LoRA adapter over the frozen base model (the `peft` library) instead of every weight: the
    optimizer holds the adapter's parameters only, checkpoints hold the adapter and its optimizer state,
    and after each step only the adapter travels to the generation engines, which serve the base model
    with it."""

    rank: int = Field(default=16, ge=1, le=512)
    """The adapter's rank `r` (vLLM serves adapters of rank up to 512)."""
    alpha: int = Field(default=32, ge=1, le=65_536)
    """`lora_alpha`: the adapter's update is scaled by `alpha / rank`."""
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter's input in the training forward (never in the forwards that compute the old
    and reference policies' log-probabilities)."""
    target_modules: ModuleNames | None = None
    """Names of the linear modules that get an adapter (`q_proj`, `down_proj`); default: every linear
    projection of attention and MLP in the decoder layers. A name no module of the model has is refused
    when the model is loaded."""

    @field_validator("target_modules")
    @classmethod
    def _unique_target_modules(cls, names: list[str] | None) -> list[str] | None:
        if names is not None and len(set(names)) != len(names):
            duplicates = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate module names {duplicates}")
        return names


class TrainingSpec(ApiModel):
    """The policy trainers (the `policy` Ray worker group)."""

    replicas: int = Field(default=1, ge=1, le=256)
    """Number of training workers (pods of the `policy` worker group)."""
    gpus_per_replica: int = Field(default=1, ge=0, le=8)
    """GPUs per training worker (0 trains on CPU)."""
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    """Optimizer settings."""
    micro_batch_size: int = Field(default=4, ge=1, le=4096)
    """Sequences per forward/backward pass; gradients accumulate over the step's batch."""
    precision: Literal["bf16", "fp32"] = "bf16"
    """On GPUs: `bf16` runs forward and backward in bfloat16 autocast over float32 master weights and
    optimizer state; `fp32` runs in float32. On the CPU training is always float32."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory for longer sequences, about a third more
    compute."""
    torch_compile: bool = False
    """On GPUs: compile each decoder layer with `torch.compile` (dynamic shapes). On the H200 the training
    phase ran about 1.4x faster with it; the first step spends 10-20 s compiling, and the trainer image
    needs a C compiler (Triton builds its launchers). Ignored on the CPU."""
    lora: LoraSpec | None = None
    """Train a LoRA adapter instead of every weight (unset: full fine-tuning)."""
    resources: WorkerResources = Field(default_factory=WorkerResources)
    """CPU, memory and shared memory of each `policy` worker pod, and of each colocated worker pod (which
    holds an engine beside each policy rank)."""

    @property
    def ranks_per_replica(self) -> int:
        """Policy ranks (processes of the FSDP2 group) on each training worker: one per GPU, one on a CPU."""
        return max(1, self.gpus_per_replica)

    @property
    def ranks(self) -> int:
        """Policy ranks over all training workers."""
        return self.replicas * self.ranks_per_replica


class KlEstimator(StrEnum):
    K1 = "k1"
    K3 = "k3"


class LossAggregation(StrEnum):
    TOKEN = "token"
    SEQUENCE = "sequence"


class AdvantageSpec(ApiModel):
    """How rewards become group-relative advantages."""

    normalize_std: bool = True
    """Divide by the group's reward standard deviation (false: Dr. GRPO's no-std variant)."""
    leave_one_out: bool = False
    """Baseline each sample with the mean of the other samples of its group (RLOO)."""


_OFF_POLICY_NEEDS_IS = (
    "spec.grpo.maxOffPolicySteps: rollouts generated by an older policy need the importance-sampling "
    "correction: set spec.grpo.importanceSamplingCap (not null) or maxOffPolicySteps: 0"
)


class GrpoSpec(ApiModel):
    """The GRPO algorithm."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!has(self.miniBatches) || self.miniBatches <= self.promptsPerStep * self.generationsPerPrompt",
                "miniBatches must not exceed the step's rollouts (promptsPerStep x generationsPerPrompt)",
            ),
            cel(
                _given("maxOffPolicySteps") + "self.maxOffPolicySteps == 0 || has(self.importanceSamplingCap)",
                _OFF_POLICY_NEEDS_IS,
                ".maxOffPolicySteps",
            ),
        )
    )

    prompts_per_step: int = Field(default=8, ge=1, le=65_536)
    """Dataset rows per training step."""
    generations_per_prompt: int = Field(default=8, ge=2, le=1024)
    """Rollouts per row; they form one group for the advantage baseline."""
    max_steps: int = Field(default=100, ge=1, le=10_000_000)
    """Training steps to run."""
    advantage: AdvantageSpec = Field(default_factory=AdvantageSpec)
    """Advantage normalisation."""
    mini_batches: int = Field(default=1, ge=1, le=1024)
    """Optimizer steps per GRPO step: the step's rollouts are split into this many mini-batches, trained
    one after another against the log-probabilities the policy gave them before the first (TRL's
    ``steps_per_generation``, verl's PPO mini-batches). With 1 the PPO ratio is exactly 1."""
    clip_low: float = Field(default=0.2, ge=0.0, le=1.0)
    """PPO ratio clip below 1 (ratio >= 1 - clipLow). Takes effect from a step's second mini-batch on
    (with one mini-batch per step the ratio is exactly 1)."""
    clip_high: float = Field(default=0.28, ge=0.0, le=10.0)
    """PPO ratio clip above 1 (ratio <= 1 + clipHigh); see clipLow."""
    kl_coef: float = Field(default=0.0, ge=0.0)
    """Weight of the KL penalty to the reference (initial) policy; 0 disables it."""
    kl_estimator: KlEstimator = KlEstimator.K3
    """KL estimator: k1 (log-ratio) or k3 (unbiased, non-negative)."""
    loss_aggregation: LossAggregation = LossAggregation.TOKEN
    """`token`: mean over all generated tokens of the batch; `sequence`: mean of per-sequence means."""
    importance_sampling_cap: float | None = Field(default=2.0, gt=0.0)
    """Truncated importance sampling: the trainer/generator probability ratio is capped at this value
    (null disables the correction)."""
    seed: int = Field(default=0, ge=0)
    """Seed for data order and sampling."""
    rollout_concurrency: int = Field(default=64, ge=1, le=100_000)
    """Rollouts (`/run` calls) in flight at once."""
    rollout_timeout_seconds: float = Field(default=600.0, gt=0)
    """A `/run` call that takes longer is abandoned (and retried, then counted as failed)."""
    rollout_retries: int = Field(default=2, ge=0, le=10)
    """Retries of a rollout after a transient failure (connection error, timeout, 429 or 5xx)."""
    rollout_deadline_seconds: float = Field(default=1800.0, gt=0)
    """All of a step's rollouts must end within this; those still running are abandoned and counted as
    failed (a hung environment would otherwise hold a step for every row's timeouts and retries)."""
    max_failed_steps: int = Field(default=3, ge=1)
    """The trainer exits with an error after this many consecutive steps in which every rollout failed."""
    max_off_policy_steps: int = Field(default=0, ge=0, le=16)
    """Asynchronous GRPO: how many policy updates older than the policy it trains a rollout may be. 0 (the
    default) is on-policy: each step's rollouts are generated, then trained on. With k >= 1 the rollouts of
    the next k steps are generated while the current step trains (the engines get new weights between
    steps, never during a request batch), so a sample is up to k updates stale; the importance-sampling
    weight (`importanceSamplingCap`, required) corrects for the older generating policy. Needs engines that
    do not share the policy's GPU (always so on Kubernetes; `grpojob run` needs 2 GPUs or none)."""

    @model_validator(mode="after")
    def _off_policy_needs_importance_sampling(self) -> GrpoSpec:
        if self.max_off_policy_steps > 0 and self.importance_sampling_cap is None:
            raise ValueError(_OFF_POLICY_NEEDS_IS)
        return self

    @model_validator(mode="after")
    def _mini_batches_within_the_step(self) -> GrpoSpec:
        rollouts = self.prompts_per_step * self.generations_per_prompt
        if self.mini_batches > rollouts:
            raise ValueError(
                f"miniBatches ({self.mini_batches}) must not exceed the step's rollouts "
                f"(promptsPerStep x generationsPerPrompt = {rollouts})"
            )
        return self


class SecretKeyRef(ApiModel):
    name: str = Field(min_length=1)
    key: str = Field(min_length=1)


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
                _given("requests", "limits")
                + "self.requests.all(k, !(k in self.limits) || !isQuantity(self.requests[k]) || "
                "!isQuantity(self.limits[k]) || quantity(self.requests[k]).compareTo(quantity(self.limits[k])) <= 0)",
                _REQUESTS_WITHIN_LIMITS,
                ".requests",
            ),
            cel(
                _given("requests", "limits")
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


class EnvironmentSpec(ApiModel):
    """One environment server speaking NeMo Gym's protocol: agent `/run`, `/seed_session`, `/verify`."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.nemoGym) || ((!has(self.command) || size(self.command) == 0) && "
                    "(!has(self.args) || size(self.args) == 0))",
                    "message": "command and args must be empty with nemoGym (the pods run ng_run)",
                }
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

    @model_validator(mode="after")
    def _nemo_gym_runs_ng_run(self) -> EnvironmentSpec:
        if self.nemo_gym is not None and (self.command or self.args):
            raise ValueError(
                f"environment {self.name}: command and args must be empty with nemoGym (the pods run ng_run)"
            )
        return self


class ConfigMapSource(ApiModel):
    name: str = Field(min_length=1)
    """ConfigMap in the GRPOJob's namespace."""
    key: str = Field(default="train.jsonl", min_length=1)
    """Key holding the JSONL rows."""


ROW_KEYS = ("responses_create_params", "agent_ref")
"""The keys of a NeMo Gym row that a mapping writes itself (the prompt and the environment)."""
_ROW_KEYS_RESERVED = "responses_create_params and agent_ref are written by the mapping itself"

MappedColumn = Annotated[str, Field(min_length=1, max_length=256)]


class DatasetMapping(ApiModel):
    """Plain prompt columns made into NeMo Gym rows: each record becomes `responses_create_params.input` =
    [a system message (`systemPrompt`), a user message (the `promptField` column)], `agent_ref.name` =
    `environment`, and the task fields its environment verifies with (`fields`, e.g. the expected answer)."""

    prompt_field: str = Field(min_length=1, max_length=256)
    """The column holding the user prompt."""
    system_prompt: str | None = Field(default=None, min_length=1, max_length=65536)
    """A system message before the prompt."""
    environment: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")
    """The environment that verifies these rows (a `spec.environments` name, or a NeMo Gym agent of one): the
    rows' `agent_ref.name`."""
    fields: dict[str, MappedColumn] = Field(
        default_factory=dict,
        max_length=64,
        json_schema_extra=cel_rules(
            cel("!('responses_create_params' in self) && !('agent_ref' in self)", _ROW_KEYS_RESERVED)
        ),
    )
    """Task fields of each row, by the column they come from (`{expected_answer: answer}`): what the
    environment needs to verify a rollout."""

    @field_validator("fields")
    @classmethod
    def _not_the_mappings_own(cls, fields: dict[str, str]) -> dict[str, str]:
        if set(fields) & set(ROW_KEYS):
            raise ValueError(_ROW_KEYS_RESERVED)
        return fields


HUB_DATASET_ID = HUB_MODEL_ID
"""A Hugging Face dataset id: `name` or `owner/name`."""
DATASET_SPLIT = r"^[A-Za-z0-9_.\-]+(\[[-0-9:%]*\])?(\+[A-Za-z0-9_.\-]+(\[[-0-9:%]*\])?)*$"
"""A split as `datasets` takes it: `train`, `test[:500]`, `train[10%:]`, `train+validation`."""
_ONE_DATASET_SOURCE = "set exactly one of path, configMap or id"
_ONE_DATASET_FORM = "set exactly one of path, configMap, id or sources"
_PVC_NEEDS_PATH = "pvc needs path (the file inside the claim)"
_ID_NEEDS_SPLIT = "id needs split (the split of the dataset to read, e.g. train)"
_DATASET_HUB_FIELDS_NEED_ID = (
    "revision, split, config, files, tokenSecret and offline go with id (a Hugging Face dataset id)"
)
_SOURCES_TAKE_THEIR_OWN_MAPPING = "mapping goes on each of sources, not beside them"


def _exactly_one(*fields: str) -> str:
    """A CEL rule: exactly one of ``fields`` is set."""
    return " + ".join(f"(has(self.{f}) ? 1 : 0)" for f in fields) + " == 1"


_DATASET_SOURCE_RULES = (
    cel("!has(self.pvc) || has(self.path)", _PVC_NEEDS_PATH, ".pvc"),
    cel(
        "has(self.id) || !(has(self.revision) || has(self.split) || has(self.config) || has(self.files) || "
        "has(self.tokenSecret) || (has(self.offline) && self.offline))",
        _DATASET_HUB_FIELDS_NEED_ID,
    ),
    cel("!has(self.id) || has(self.split)", _ID_NEEDS_SPLIT, ".split"),
)

_IN_DATASET_RULE, _IN_DATASET = _stays_inside("the dataset")
DatasetFile = Annotated[
    str,
    Field(
        min_length=1,
        max_length=1024,
        pattern=r"^[^/]",
        json_schema_extra=_IN_DATASET_RULE,
    ),
    _IN_DATASET,
]
"""A file (or glob) inside a hub dataset's repository, relative to its root."""


class DatasetSource(ApiModel):
    """One source of rows, exactly one of: a JSONL file (`path`, inside `pvc` on Kubernetes), a `configMap` key
    of JSONL, or a Hugging Face dataset `id` (downloaded once before the job starts, into the job's Hugging
    Face cache, `spec.model.cache`). The rows are NeMo Gym rows (`responses_create_params`, `agent_ref`, task
    fields) as they are, or plain columns made into them by a `mapping`."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(_exactly_one("path", "configMap", "id"), _ONE_DATASET_SOURCE), *_DATASET_SOURCE_RULES
        )
    )

    path: str | None = Field(default=None, min_length=1, max_length=MAX_PATH_LENGTH)
    """Path of the JSONL file (local under `grpojob run`; inside `pvc` on Kubernetes)."""
    pvc: PvcSource | None = None
    """Claim holding `path`."""
    config_map: ConfigMapSource | None = None
    """ConfigMap holding the rows."""
    id: str | None = Field(default=None, max_length=96, pattern=HUB_DATASET_ID)
    """A Hugging Face dataset id (`openai/gsm8k`): the operator downloads it before the job starts, the
    trainer reads that one revision with `datasets` (`load_dataset(<snapshot>, name=config, split=split,
    data_files=files)`), offline. `grpojob run` takes it from this machine's hub cache only."""
    revision: str | None = Field(default=None, min_length=1, max_length=255, pattern=r"^[^\s]+$")
    """Branch, tag or commit of `id` (default `main`); resolved to one commit by the download
    (`status.datasetCommits`)."""
    split: str | None = Field(default=None, max_length=256, pattern=DATASET_SPLIT)
    """The split of `id` to read (`train`, `test[:500]`, `train+validation`): needed with `id`."""
    config: str | None = Field(default=None, min_length=1, max_length=256, pattern=r"^[^\s]+$")
    """The configuration of `id` (`name` in `load_dataset`: `main` of `openai/gsm8k`), as its card defines."""
    files: list[DatasetFile] | None = Field(default=None, min_length=1, max_length=64)
    """Files (or globs) of `id` to read (`data_files` in `load_dataset`); only these, and the card, are
    downloaded."""
    token_secret: SecretKeyRef | None = None
    """The Secret key holding a Hugging Face token for a gated or private `id` (default: the model's,
    `spec.model.tokenSecret`, when it has one)."""
    offline: bool = False
    """Take `id` from the cache only, never from the hub (a cache filled beforehand with `grpojob cache-dataset`
    or `hf download --repo-type dataset`)."""
    mapping: DatasetMapping | None = None
    """Make plain prompt columns into NeMo Gym rows; without it the rows must be NeMo Gym rows already."""

    @model_validator(mode="after")
    def _one_source(self) -> DatasetSource:
        _check_source(self, (self.path, self.config_map, self.id), _ONE_DATASET_SOURCE)
        return self


def _check_source(source: DatasetSource, kinds: tuple[object, ...], exactly_one: str) -> None:
    """The rules of one source (`_DATASET_SOURCE_RULES`), with ``kinds`` the forms of which one must be set."""
    if sum(kind is not None for kind in kinds) != 1:
        raise ValueError(exactly_one)
    if source.pvc is not None and source.path is None:
        raise ValueError(_PVC_NEEDS_PATH)
    hub_fields = (source.revision, source.split, source.config, source.files, source.token_secret)
    if source.id is None and (any(f is not None for f in hub_fields) or source.offline):
        raise ValueError(_DATASET_HUB_FIELDS_NEED_ID)
    if source.id is not None and source.split is None:
        raise ValueError(_ID_NEEDS_SPLIT)


class WeightedDatasetSource(DatasetSource):
    """One of several sources of training rows (`spec.dataset.sources`), drawn from by its weight."""

    weight: float = Field(default=1.0, gt=0.0, le=1_000_000)
    """Its share of each step's prompts, relative to the other sources' weights: each prompt of a step comes
    from this source with probability weight / (the sum of the weights), drawn from `spec.grpo.seed`."""


class DatasetSpec(DatasetSource):
    """Training rows: one source (`path`, `configMap` or `id`, as `DatasetSource` says), or several weighted
    `sources` that each step's prompts are drawn from by weight."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(_exactly_one("path", "configMap", "id", "sources"), _ONE_DATASET_FORM),
            *_DATASET_SOURCE_RULES,
            cel("!has(self.sources) || !has(self.mapping)", _SOURCES_TAKE_THEIR_OWN_MAPPING, ".mapping"),
        )
    )

    sources: list[WeightedDatasetSource] | None = Field(default=None, min_length=1, max_length=16)
    """Several sources, each with a weight: every prompt of a step is drawn from one of them by weight
    (deterministically from `spec.grpo.seed` and the step), and each goes through its rows in its own
    shuffled epochs; a checkpoint keeps every source's place, so a resumed run draws the prompts an
    uninterrupted one would. Instead of `path`, `configMap` or `id`."""

    @model_validator(mode="after")
    def _one_source(self) -> DatasetSpec:
        _check_source(self, (self.path, self.config_map, self.id, self.sources), _ONE_DATASET_FORM)
        if self.sources is not None and self.mapping is not None:
            raise ValueError(_SOURCES_TAKE_THEIR_OWN_MAPPING)
        return self

    def all_sources(self) -> list[DatasetSource]:
        """The sources rows are drawn from: ``sources``, or this one."""
        return list(self.sources) if self.sources is not None else [self]

    def weights(self) -> list[float]:
        """Each source's weight (1 for a single source)."""
        return [s.weight for s in self.sources] if self.sources is not None else [1.0]

    def source_fields(self, prefix: str = "spec.dataset") -> list[str]:
        """Each source's field path, as messages name it: ``prefix``, or `prefix.sources[i]`."""
        return [f"{prefix}.sources[{i}]" for i in range(len(self.sources))] if self.sources is not None else [prefix]


class EvaluationSpec(ApiModel):
    """Evaluation on held-out rows while training, as NeMo-RL's `val_period`, verl's `test_freq` and TRL's
    `eval_steps` do it: the rows go through the job's environments and engines between training steps,
    sampled with the evaluation's own parameters, and are never trained on."""

    dataset: DatasetSource
    """The held-out rows: a path (in a claim), a ConfigMap or a Hugging Face dataset id, as one source of
    `spec.dataset`."""
    every_steps: int = Field(default=10, ge=1)
    """Evaluate the policy of every this many steps (and of the last step)."""
    before_training: bool = True
    """Also evaluate the starting policy: a step-0 baseline."""
    k: int = Field(default=1, ge=1, le=64)
    """Rollouts per prompt (`eval/pass@k` counts a prompt as passed when one of them passes)."""
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    """Sampling temperature of evaluation rollouts; 0 is greedy (unlike training, allowed here)."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus-sampling top-p of evaluation rollouts."""
    max_new_tokens: int | None = Field(default=None, ge=1, le=1_048_576)
    """Most tokens one model call of an evaluation rollout may generate (default:
    `spec.generation.maxNewTokens`, which also caps it)."""
    max_rows: int | None = Field(default=None, ge=1, le=1_000_000)
    """Evaluate on the first this many rows of the dataset (default: all)."""
    pass_threshold: float = 1.0
    """A rollout passes when its reward is at least this."""


class CheckpointSpec(ApiModel):
    """Checkpoints (model, optimizer, step, RNG state, data position); a restarted trainer resumes."""

    pvc: PvcSource | None = None
    """Claim to write checkpoints to (on Kubernetes); without it checkpoints stay in the pod."""
    path: VolumePath | None = Field(default=None, min_length=1)
    """Directory: inside the claim on Kubernetes (without `..`), relative to the working directory (or
    absolute) with `grpojob run`. Default `checkpoints/<job name>`, so jobs sharing a claim never resume
    each other's runs."""
    interval: int = Field(default=10, ge=1)
    """Save every this many steps (and after the last)."""
    keep: int = Field(default=2, ge=1)
    """Newest checkpoints kept."""


class OutputFormat(StrEnum):
    MERGED = "merged"
    ADAPTER = "adapter"


class OutputSelect(StrEnum):
    LAST = "last"
    BEST_EVALUATION = "bestEvaluation"


class OutputSpec(ApiModel):
    """The trained policy as a Hugging Face model directory (`config.json`, safetensors, tokenizer files,
    `generation_config.json`) that `vllm serve` and `transformers` load as they are: written at the end of
    the job to `<path>/final` and, with `everyCheckpoint`, with each checkpoint to `<path>/step_<step>`."""

    pvc: PvcSource | None = None
    """Claim to write to (default: `spec.checkpointing.pvc`); without any, the model stays in the policy pod."""
    path: VolumePath | None = Field(default=None, min_length=1)
    """Directory: inside the claim on Kubernetes (without `..`), relative to the working directory (or
    absolute) with `grpojob run`. Default `models/<job name>`."""
    every_checkpoint: bool = False
    """Also export the model with each checkpoint (the newest `spec.checkpointing.keep` of them kept)."""
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """Data type of the exported weights (training keeps float32 master weights)."""
    format: OutputFormat = OutputFormat.MERGED
    """`merged`: a full model directory (with `spec.training.lora`, the adapter merged into the base).
    `adapter` (needs `spec.training.lora`): a PEFT adapter directory (`adapter_config.json` naming its
    base model, `adapter_model.safetensors`), which `vllm serve BASE --enable-lora --lora-modules
    NAME=DIR` and `peft` load."""
    select: OutputSelect = OutputSelect.LAST
    """Which policy `<path>/final` holds: `last`, the policy of the last step, or `bestEvaluation` (needs
    `spec.evaluation`), the evaluated policy with the highest `eval/reward/mean` (its checkpoint is kept
    whatever `spec.checkpointing.keep` says)."""


class MlflowSpec(ApiModel):
    """An MLflow tracking server: one run per trainer attempt, every step's metrics, the job's spec as
    the run's parameters."""

    tracking_uri: str = Field(min_length=1, max_length=2048)
    """The tracking server (`http://mlflow.mlops:5000`), as `MLFLOW_TRACKING_URI` takes it."""
    experiment: str | None = Field(default=None, min_length=1, max_length=256)
    """Experiment of the runs (created when absent); default: the job's name."""
    credentials_secret: str | None = Field(default=None, min_length=1, max_length=253)
    """Secret in the job's namespace whose keys become the trainer's environment variables: MLflow's own
    (`MLFLOW_TRACKING_USERNAME` and `MLFLOW_TRACKING_PASSWORD`, or `MLFLOW_TRACKING_TOKEN`)."""


class WandbMode(StrEnum):
    ONLINE = "online"
    OFFLINE = "offline"


_WANDB_ONLINE_NEEDS_KEY = "spec.logging.wandb.apiKeySecret is needed in online mode"


class WandbSpec(ApiModel):
    """Weights & Biases: one run per trainer attempt, every step's metrics, the job's spec as its config."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(_given("mode") + "self.mode != 'online' || has(self.apiKeySecret)", _WANDB_ONLINE_NEEDS_KEY)
        )
    )

    project: str = Field(min_length=1, max_length=128)
    """W&B project of the runs."""
    entity: str | None = Field(default=None, min_length=1, max_length=128)
    """W&B entity (user or team); default: the API key's."""
    mode: WandbMode = WandbMode.ONLINE
    """`online` sends the runs to W&B; `offline` writes them under the log directory (`wandb sync` uploads
    them later)."""
    api_key_secret: SecretKeyRef | None = None
    """The Secret key holding `WANDB_API_KEY` (needed online)."""

    @model_validator(mode="after")
    def _online_needs_key(self) -> WandbSpec:
        if self.mode == WandbMode.ONLINE and self.api_key_secret is None:
            raise ValueError(_WANDB_ONLINE_NEEDS_KEY)
        return self


class LoggingSpec(ApiModel):
    """Where the trainer's metrics go: TensorBoard events and `metrics.jsonl` on a claim, a TensorBoard
    server, MLflow, W&B. Every trainer attempt writes a run directory `attempt-<n>` of its own; a retried
    job resumes at its checkpoint's step, so the runs join into one curve."""

    pvc: PvcSource | None = None
    """Claim for the logs; default: the checkpoint claim (`spec.checkpointing.pvc`). Without either, the
    logs stay in the trainer pod and go with it."""
    path: VolumePath | None = Field(default=None, min_length=1)
    """Directory inside the claim (without `..`); default `logs/<job name>`."""
    tensorboard: bool = False
    """Run a TensorBoard server over the logs (Deployment and Service `<job>-tensorboard`, port 6006); needs a
    claim."""
    mlflow: MlflowSpec | None = None
    """Log to an MLflow tracking server too."""
    wandb: WandbSpec | None = None
    """Log to Weights & Biases too."""


class ImagesSpec(ApiModel):
    """Container images; each defaults to the operator's setting."""

    ray: str | None = None
    """Image of the Ray head and workers (trainer image with Ray, vLLM, PyTorch)."""
    trainer: str | None = None
    """Image of the trainer Job (defaults to `ray`)."""
    environment: str | None = None
    """Default image of environment servers."""


class CleanupPolicy(StrEnum):
    """What is deleted when a GRPOJob finishes."""

    DELETE_CLUSTER = "DeleteCluster"
    """Delete the RayCluster and environment servers, keep the trainer Job for its logs."""
    DELETE_ALL = "DeleteAll"
    """Delete the whole workload, the trainer Job included (the small config objects stay until the
    GRPOJob itself is deleted)."""
    KEEP_ALL = "KeepAll"
    """Keep everything (for debugging; GPUs stay allocated)."""


_TENSORBOARD_NEEDS_CLAIM = (
    "spec.logging.tensorboard needs a claim for the logs: spec.logging.pvc or spec.checkpointing.pvc"
)


# Label keys the operator sets on the pods, or that another controller reads from them: a role's own
# labels may not use them (a copied Kueue queue name would have Kueue admit the pods a second time).
RESERVED_LABEL_PREFIXES = ("grpo.dev/", "ray.io/", "kueue.x-k8s.io/", "app.kubernetes.io/managed-by")
_RESERVED_LABELS = "must not use the keys the operator sets (" + ", ".join(RESERVED_LABEL_PREFIXES) + "...)"
_TOLERATION_EXISTS = "operator Exists takes no value"
_TOLERATION_NO_KEY = "an empty key needs operator Exists (it tolerates every taint)"
_TOLERATION_SECONDS = "tolerationSeconds needs effect NoExecute"
MAX_SCHEDULING_ENTRIES = 32
MAX_LABEL_KEY_LENGTH = 317  # a DNS subdomain prefix (253), `/`, a name (63)
MAX_ANNOTATION_VALUE_LENGTH = 4096


class Toleration(ApiModel):
    """A toleration of the role's pods (core/v1 Toleration)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
                _TOLERATION_EXISTS,
                ".value",
            ),
            cel(
                "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
                _TOLERATION_NO_KEY,
                ".operator",
            ),
            cel(
                "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                _TOLERATION_SECONDS,
                ".tolerationSeconds",
            ),
        )
    )

    key: str = Field(default="", max_length=MAX_LABEL_KEY_LENGTH)
    """Taint key (empty with operator Exists: every taint)."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """`Equal` tolerates the taint of this key and value; `Exists` any value (and no value is given)."""
    value: str = Field(default="", max_length=63)
    """Taint value (with operator Equal)."""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""
    """Taint effect to tolerate (empty: every effect)."""
    toleration_seconds: int | None = None
    """With effect NoExecute: how long the pod stays on a node after the taint appears."""

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError(_TOLERATION_EXISTS)
        if not self.key and self.operator != "Exists":
            raise ValueError(_TOLERATION_NO_KEY)
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError(_TOLERATION_SECONDS)
        return self


FreeForm = Annotated[dict[str, Any], Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})]


class Affinity(ApiModel):
    """Pod affinity rules (core/v1 Affinity), kept as written; the API server checks them on the pods."""

    node_affinity: FreeForm = Field(default_factory=dict)
    """core/v1 NodeAffinity: the nodes the pods must or should run on."""
    pod_affinity: FreeForm = Field(default_factory=dict)
    """core/v1 PodAffinity: pods the role's pods must or should run beside."""
    pod_anti_affinity: FreeForm = Field(default_factory=dict)
    """core/v1 PodAntiAffinity: pods the role's pods must or should keep away from."""

    def to_pod(self) -> dict[str, Any]:
        """The pod's `affinity`: the parts that are set."""
        return {k: v for k, v in self.model_dump(by_alias=True).items() if v}


def _no_reserved_keys(labels: dict[str, str]) -> dict[str, str]:
    taken = sorted(k for k in labels if k.startswith(RESERVED_LABEL_PREFIXES))
    if taken:
        raise ValueError(f"{taken} {_RESERVED_LABELS}")
    return labels


LabelMap = Annotated[
    dict[str, Annotated[str, Field(max_length=63)]],
    Field(
        max_length=MAX_SCHEDULING_ENTRIES,
        json_schema_extra=cel_rules(
            cel(
                "self.all(k, " + " && ".join(f"!k.startsWith('{p}')" for p in RESERVED_LABEL_PREFIXES) + ")",
                _RESERVED_LABELS,
            )
        ),
    ),
    AfterValidator(_no_reserved_keys),
]


class PodScheduling(ApiModel):
    """Where and how one role's pods are scheduled: a small override of their pod template, as RayJob
    users shape their pods. Applied to every pod of the role; the operator's own labels win."""

    node_selector: dict[str, Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict, max_length=MAX_SCHEDULING_ENTRIES
    )
    """Node labels the pods must run on (a node pool)."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=MAX_SCHEDULING_ENTRIES)
    """Taints the pods tolerate."""
    affinity: Affinity | None = None
    """Node and pod affinity and anti-affinity."""
    priority_class_name: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
    )
    """PriorityClass of the pods."""
    scheduler_name: str | None = Field(default=None, min_length=1, max_length=253)
    """Scheduler of the pods (default: the cluster's default scheduler)."""
    labels: LabelMap = Field(default_factory=dict)
    """Extra labels on the pods."""
    annotations: dict[str, Annotated[str, Field(max_length=MAX_ANNOTATION_VALUE_LENGTH)]] = Field(
        default_factory=dict, max_length=MAX_SCHEDULING_ENTRIES
    )
    """Extra annotations on the pods."""


class SchedulingSpec(ApiModel):
    """Per-role scheduling of the job's pods."""

    head: PodScheduling = Field(default_factory=PodScheduling)
    """The Ray head pod."""
    generation: PodScheduling = Field(default_factory=PodScheduling)
    """The `generation` Ray workers (generation engines; a colocated job has none: its engines run in the
    `colocated` workers, which take `policy`'s scheduling)."""
    policy: PodScheduling = Field(default_factory=PodScheduling)
    """The `policy` Ray workers (policy training), or the `colocated` workers (a policy rank and an engine)."""
    environments: PodScheduling = Field(default_factory=PodScheduling)
    """Every environment server pod (ours, and NeMo Gym's with `nemoGym`)."""
    trainer: PodScheduling = Field(default_factory=PodScheduling)
    """The trainer pod (the Ray driver), and the job's other CPU pods: the download of a hub model
    (`spec.model.id`) and TensorBoard (`spec.logging.tensorboard`)."""


_ADAPTER_OUTPUT_NEEDS_LORA = (
    "spec.output.format: adapter needs spec.training.lora (a full fine-tune has no adapter to write)"
)
_BEST_EVALUATION_NEEDS_EVALUATION = "spec.output.select: bestEvaluation needs spec.evaluation"
_CACHE_NEEDS_AN_ID = "spec.model.cache (the job's Hugging Face cache) needs spec.model.id or a dataset named by id"
_A_DATASET_ID = (
    "has(self.dataset.id) || (has(self.dataset.sources) && self.dataset.sources.exists(s, has(s.id))) || "
    "(has(self.evaluation) && has(self.evaluation.dataset.id))"
)


def _unknown_environment(field: str) -> str:
    return f"{field}.environment must name one of spec.environments (or the NeMo Gym agent of one)"


def _names_an_environment(mapping: str) -> str:
    """A CEL expression: the ``mapping``'s environment is an environment's name or its NeMo Gym agent."""
    return (
        f"self.environments.exists(e, e.name == {mapping}.environment || "
        f"(has(e.nemoGym) && e.nemoGym.agent == {mapping}.environment))"
    )


SPLIT_ENGINE_MEMORY_SHARE = 0.9
COLOCATED_ENGINE_MEMORY_SHARE = 0.35
MAX_COLOCATED_ENGINE_MEMORY_SHARE = 0.7
"""The most of a GPU an engine may take beside a policy rank, which keeps its weights, gradients and optimizer
state on the GPU while the engine generates."""


class Placement(StrEnum):
    """Where the generation engines run relative to the policy's ranks."""

    COLOCATED = "colocated"
    """Each GPU holds one engine and one policy rank, in one worker group: the new weights (or the adapter)
    reach the engine by CUDA IPC inside the pod, and the engine sleeps while the policy trains
    (`spec.generation.sleepWhileTraining`). Half the GPUs of `split` for on-policy GRPO, where engine and
    policy take turns anyway."""
    SPLIT = "split"
    """Engines on GPUs of their own (the `generation` worker group) and the policy on others (`policy`):
    weights travel by NCCL broadcast. For asynchronous GRPO (`spec.grpo.maxOffPolicySteps` >= 1), which
    generates while the policy trains, and for engines with more GPUs than a rank (tensor parallel)."""


_COLOCATED_ON_POLICY = (
    "spec.placement: colocated needs spec.grpo.maxOffPolicySteps: 0 (asynchronous GRPO generates while the "
    "policy trains, so its engines need GPUs of their own): set spec.placement: split"
)
_COLOCATED_ONE_GPU_PER_POD = (
    "spec.placement: colocated puts one engine and one policy rank in each worker pod: "
    "spec.training.gpusPerReplica must be 0 or 1 (scale with spec.training.replicas)"
)
_COLOCATED_SAME_GPUS = (
    "spec.placement: colocated shares each GPU between an engine and a policy rank: "
    "spec.generation.gpusPerReplica must equal spec.training.gpusPerReplica (for tensor-parallel engines set "
    "spec.placement: split)"
)
_COLOCATED_SAME_REPLICAS = (
    "spec.placement: colocated runs one engine beside each policy rank: "
    "spec.generation.replicas must equal spec.training.replicas"
)
_COLOCATED_MEMORY_SHARE = (
    "spec.placement: colocated leaves the policy rank the GPU memory its engine does not take: "
    f"spec.generation.gpuMemoryUtilization must be at most {MAX_COLOCATED_ENGINE_MEMORY_SHARE} "
    f"(unset: {COLOCATED_ENGINE_MEMORY_SHARE} when colocated)"
)
_GIVEN_PLACEMENT = "!has(self.placement) || self.placement != 'colocated' || "


class GRPOJobSpec(ApiModel):
    """Desired state of a GRPOJob."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!has(self.logging) || !has(self.logging.tensorboard) || !self.logging.tensorboard || "
                "has(self.logging.pvc) || (has(self.checkpointing) && has(self.checkpointing.pvc))",
                _TENSORBOARD_NEEDS_CLAIM,
                ".logging.tensorboard",
            ),
            cel(
                "!has(self.output) || !has(self.output.format) || self.output.format != 'adapter' || "
                "(has(self.training) && has(self.training.lora))",
                _ADAPTER_OUTPUT_NEEDS_LORA,
                ".output.format",
            ),
            cel(
                "!has(self.output) || !has(self.output.select) || self.output.select != 'bestEvaluation' || "
                "has(self.evaluation)",
                _BEST_EVALUATION_NEEDS_EVALUATION,
                ".output.select",
            ),
            cel(f"!has(self.model.cache) || has(self.model.id) || {_A_DATASET_ID}", _CACHE_NEEDS_AN_ID, ".model.cache"),
            cel(
                "!has(self.dataset.mapping) || " + _names_an_environment("self.dataset.mapping"),
                _unknown_environment("spec.dataset.mapping"),
                ".dataset.mapping.environment",
            ),
            cel(
                "!has(self.dataset.sources) || self.dataset.sources.all(s, !has(s.mapping) || "
                + _names_an_environment("s.mapping")
                + ")",
                _unknown_environment("spec.dataset.sources[*].mapping"),
                ".dataset.sources",
            ),
            cel(
                "!has(self.evaluation) || !has(self.evaluation.dataset.mapping) || "
                + _names_an_environment("self.evaluation.dataset.mapping"),
                _unknown_environment("spec.evaluation.dataset.mapping"),
                ".evaluation.dataset.mapping.environment",
            ),
            cel(
                _GIVEN_PLACEMENT + "!has(self.grpo) || !has(self.grpo.maxOffPolicySteps) || "
                "self.grpo.maxOffPolicySteps == 0",
                _COLOCATED_ON_POLICY,
                ".placement",
            ),
            cel(
                _GIVEN_PLACEMENT + "!has(self.training) || !has(self.training.gpusPerReplica) || "
                "self.training.gpusPerReplica <= 1",
                _COLOCATED_ONE_GPU_PER_POD,
                ".placement",
            ),
            cel(
                _GIVEN_PLACEMENT + "(has(self.generation) && has(self.generation.gpusPerReplica) ? "
                "self.generation.gpusPerReplica : 1) == "
                "(has(self.training) && has(self.training.gpusPerReplica) ? self.training.gpusPerReplica : 1)",
                _COLOCATED_SAME_GPUS,
                ".placement",
            ),
            cel(
                _GIVEN_PLACEMENT + "!has(self.generation) || !has(self.generation.gpuMemoryUtilization) || "
                f"self.generation.gpuMemoryUtilization <= {MAX_COLOCATED_ENGINE_MEMORY_SHARE}",
                _COLOCATED_MEMORY_SHARE,
                ".placement",
            ),
            cel(
                _GIVEN_PLACEMENT + "(has(self.generation) && has(self.generation.replicas) ? "
                "self.generation.replicas : 1) == "
                "(has(self.training) && has(self.training.replicas) ? self.training.replicas : 1)",
                _COLOCATED_SAME_REPLICAS,
                ".placement",
            ),
        )
    )

    model: ModelSpec
    """The policy model."""
    dataset: DatasetSpec
    """Training rows."""
    evaluation: EvaluationSpec | None = None
    """Evaluation on held-out rows while training."""
    environments: list[EnvironmentSpec] = Field(
        min_length=1,
        max_length=16,
        # A list keyed by name: the API server refuses two environments of one name.
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """Environment servers, each of its own name; each dataset row's `agent_ref.name` picks one."""
    generation: GenerationSpec = Field(default_factory=GenerationSpec)
    """Generation engines and sampling."""
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    """Policy trainers."""
    placement: Placement | None = None
    """Where the generation engines run: `colocated` (each GPU holds an engine and a policy rank, which take
    turns: half the GPUs, weights by CUDA IPC) or `split` (engines and policy on GPUs of their own, weights by
    NCCL: what asynchronous GRPO and tensor-parallel engines need). Unset: colocated for an on-policy job
    whose engines match its policy's ranks one to one (`generation.replicas` = `training.replicas`, the same
    `gpusPerReplica`, at most 1) and whose `generation.gpuMemoryUtilization`, if set, is at most 0.7; split
    otherwise. The chosen placement is in `status.placement`."""
    grpo: GrpoSpec = Field(default_factory=GrpoSpec)
    """The algorithm."""
    checkpointing: CheckpointSpec = Field(default_factory=CheckpointSpec)
    """Checkpoints."""
    output: OutputSpec = Field(default_factory=OutputSpec)
    """Where the trained model goes."""
    logging: LoggingSpec = Field(default_factory=LoggingSpec)
    """Metrics: logs on a claim, TensorBoard, MLflow, W&B."""
    images: ImagesSpec = Field(default_factory=ImagesSpec)
    """Images, defaulted from operator settings."""
    suspend: bool = False
    """True removes the RayCluster, environment servers and trainer but keeps the GRPOJob (Kueue)."""
    backoff_limit: int = Field(default=3, ge=0, le=100)
    """Failed trainer attempts retried before the job fails."""
    active_deadline_seconds: int | None = Field(default=None, ge=1, le=MAX_SECONDS)
    """Fail the job when it has run this long (counted from its start)."""
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0, le=MAX_SECONDS)
    """Delete the GRPOJob this long after it succeeds or fails."""
    cleanup_policy: CleanupPolicy = CleanupPolicy.DELETE_CLUSTER
    """What to delete when the job finishes."""
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    """Node selectors, tolerations, affinity, priority class, scheduler, labels and annotations of each
    role's pods (Ray head, generation and policy workers, environments, trainer)."""
    progress_deadline_seconds: int | None = Field(default=None, ge=1, le=MAX_SECONDS)
    """A Running job whose training step has not advanced for this long is stalled: the attempt fails
    (condition `Stalled`) and is retried within `backoffLimit`. Unset: no stall detection."""

    def colocation_conflicts(self) -> list[str]:
        """Why this spec's engines cannot share the policy's GPUs (empty when they can)."""
        generation, training = self.generation, self.training
        conflicts = []
        if self.grpo.max_off_policy_steps > 0:
            conflicts.append(_COLOCATED_ON_POLICY)
        if training.gpus_per_replica > 1:
            conflicts.append(_COLOCATED_ONE_GPU_PER_POD)
        if generation.gpus_per_replica != training.gpus_per_replica:
            conflicts.append(_COLOCATED_SAME_GPUS)
        if generation.replicas != training.replicas:
            conflicts.append(_COLOCATED_SAME_REPLICAS)
        share = generation.gpu_memory_utilization
        if share is not None and share > MAX_COLOCATED_ENGINE_MEMORY_SHARE:
            conflicts.append(_COLOCATED_MEMORY_SHARE)
        return conflicts

    @property
    def resolved_placement(self) -> Placement:
        """`placement`, or when unset colocated if the engines can share the policy's GPUs, else split."""
        if self.placement is not None:
            return self.placement
        return Placement.SPLIT if self.colocation_conflicts() else Placement.COLOCATED

    @model_validator(mode="after")
    def _colocated_can_share(self) -> GRPOJobSpec:
        if self.placement == Placement.COLOCATED:
            conflicts = self.colocation_conflicts()
            if conflicts:
                raise ValueError("; ".join(conflicts))
        return self

    def engine_memory_share(self, shares_gpu: bool) -> float:
        """vLLM's fraction of its GPUs' memory: `generation.gpuMemoryUtilization`, unset meaning 0.9 for an engine
        with GPUs of its own and 0.35 for one sharing (``shares_gpu``) a policy rank's GPU."""
        asked = self.generation.gpu_memory_utilization
        if asked is not None:
            return asked
        return COLOCATED_ENGINE_MEMORY_SHARE if shares_gpu else SPLIT_ENGINE_MEMORY_SHARE

    def engine_sleeps(self, shares_gpu: bool) -> bool:
        """Whether a vLLM engine sharing (``shares_gpu``) the policy's GPU sleeps while it trains:
        `generation.sleepWhileTraining`, unset meaning yes for a full fine-tune and no for a LoRA policy."""
        asked = self.generation.sleep_while_training
        return shares_gpu and (asked if asked is not None else self.training.lora is None)

    @property
    def evaluation_max_new_tokens(self) -> int:
        """Most tokens one model call of an evaluation rollout generates: `evaluation.maxNewTokens`, capped by
        (and by default) `generation.maxNewTokens`."""
        asked = self.evaluation.max_new_tokens if self.evaluation is not None else None
        return min(asked or self.generation.max_new_tokens, self.generation.max_new_tokens)

    @property
    def log_claim(self) -> PvcSource | None:
        """The claim the logs go to: `logging.pvc`, else the checkpoint claim, else none (the pod's disk)."""
        return self.logging.pvc or self.checkpointing.pvc

    @model_validator(mode="after")
    def _tensorboard_needs_claim(self) -> GRPOJobSpec:
        if self.logging.tensorboard and self.log_claim is None:
            raise ValueError(_TENSORBOARD_NEEDS_CLAIM)
        return self

    @model_validator(mode="after")
    def _best_evaluation_needs_evaluation(self) -> GRPOJobSpec:
        if self.output.select == OutputSelect.BEST_EVALUATION and self.evaluation is None:
            raise ValueError(_BEST_EVALUATION_NEEDS_EVALUATION)
        return self

    @model_validator(mode="after")
    def _cache_needs_an_id(self) -> GRPOJobSpec:
        if self.model.cache is not None and self.model.id is None and not self.hub_datasets():
            raise ValueError(_CACHE_NEEDS_AN_ID)
        return self

    @model_validator(mode="after")
    def _mappings_name_environments(self) -> GRPOJobSpec:
        known = {e.name for e in self.environments} | {e.nemo_gym.agent for e in self.environments if e.nemo_gym}
        for field, source in self.dataset_sources():
            if source.mapping is not None and source.mapping.environment not in known:
                raise ValueError(_unknown_environment(f"{field}.mapping") + f": {source.mapping.environment!r}")
        return self

    def dataset_sources(self) -> list[tuple[str, DatasetSource]]:
        """Every source of rows, with its field path: the training dataset's, then the evaluation's."""
        found = list(zip(self.dataset.source_fields(), self.dataset.all_sources(), strict=True))
        if self.evaluation is not None:
            found.append(("spec.evaluation.dataset", self.evaluation.dataset))
        return found

    def hub_datasets(self) -> list[tuple[str, DatasetSource]]:
        """The sources named by a Hugging Face dataset id, with their field paths."""
        return [(field, source) for field, source in self.dataset_sources() if source.id is not None]

    @model_validator(mode="after")
    def _adapter_output_needs_lora(self) -> GRPOJobSpec:
        if self.output.format == OutputFormat.ADAPTER and self.training.lora is None:
            raise ValueError(_ADAPTER_OUTPUT_NEEDS_LORA)
        return self

    @field_validator("environments")
    @classmethod
    def _unique_environment_names(cls, environments: list[EnvironmentSpec]) -> list[EnvironmentSpec]:
        names = [e.name for e in environments]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"spec.environments: duplicate names {duplicates}")
        return environments


# --------------------------------------------------------------------------------------------------
# status


class Phase(StrEnum):
    """Coarse lifecycle for humans and `kubectl get`; machines read `conditions`."""

    PENDING = "Pending"
    INITIALIZING = "Initializing"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    QUEUED = "Queued"
    """Waiting for Kueue to admit the job (label `kueue.x-k8s.io/queue-name`), or evicted by it: no pods."""

    def is_terminal(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED)


class ConditionType(StrEnum):
    MODEL_READY = "ModelReady"
    DATASET_READY = "DatasetReady"
    """The datasets named by id are downloaded (by the same Job as a hub model)."""
    RAY_CLUSTER_READY = "RayClusterReady"
    ENDPOINTS_PUBLISHED = "EndpointsPublished"
    ENVIRONMENTS_READY = "EnvironmentsReady"
    TRAINER_RUNNING = "TrainerRunning"
    COMPLETE = "Complete"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    STALLED = "Stalled"
    ADMITTED = "Admitted"
    """Kueue admitted the job's Workload (only for a job labelled `kueue.x-k8s.io/queue-name`)."""
    QUOTA_EXCEEDED = "QuotaExceeded"
    """A child would exceed a ResourceQuota of the namespace: the job waits (with backoff) until it fits."""


class Condition(ApiModel):
    """A Kubernetes condition (metav1.Condition)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    message: str = Field(default="", max_length=32768)
    last_transition_time: datetime
    observed_generation: int | None = None


class OutputModelStatus(ApiModel):
    """Where the newest exported model is: a `spec.model` `path` (and `pvc`) that serves or continues it."""

    path: str
    """Directory of the model: inside the claim, or in the policy pod (or, with `grpojob run`, locally)."""
    claim_name: str | None = None
    """The claim holding it (none: it is in the policy pod and goes with it)."""
    step: int
    """Training step the model was exported at."""
    format: OutputFormat = OutputFormat.MERGED
    """`merged`: a full model directory; `adapter`: a PEFT adapter directory, served over its base model
    (`spec.output.format`)."""


class EvaluationStatus(ApiModel):
    """One evaluation of the policy (`spec.evaluation`)."""

    step: int
    """The training step whose policy was evaluated (0: before training)."""
    mean_reward: float
    """`eval/reward/mean`: the mean reward of its rollouts."""


class GRPOJobStatus(ApiModel):
    """Observed state of a GRPOJob, written only by the operator's status writer."""

    phase: Phase = Phase.PENDING
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = None
    attempt: int = 0
    """Trainer attempt, counted from 1; incremented on each retry."""
    start_time: datetime | None = None
    completion_time: datetime | None = None
    step: int | None = None
    """Last finished training step, as the trainer reported it."""
    mean_reward: float | None = None
    """Mean reward of the last finished step."""
    last_evaluation: EvaluationStatus | None = None
    """The newest evaluation (`spec.evaluation`)."""
    best_evaluation: EvaluationStatus | None = None
    """The evaluation of a trained policy (step >= 1) with the highest mean reward so far (the earliest of
    equals): the one `spec.output.select: bestEvaluation` exports."""
    model_commit: str | None = None
    """The commit of `spec.model.id` that the download resolved; every pod loads this one."""
    dataset_commits: dict[str, str] | None = None
    """The commit each dataset named by id resolved to, by `<id>@<revision>` (training and evaluation sources
    alike); the trainer reads these."""
    output_model: OutputModelStatus | None = None
    """The newest model the trainer exported (`spec.output`)."""
    progress_time: datetime | None = None
    """When the current attempt last made progress: its trainer started running, or the step advanced.
    `spec.progressDeadlineSeconds` counts from here."""
    placement: Placement | None = None
    """Where the engines run (`spec.placement`, or the default chosen for the spec): colocated or split."""
    gcs_address: str | None = None
    """The Ray GCS address published in `<job>-endpoints`."""
    reason: str | None = None
    """Why the job is in its phase (CamelCase), mirrored from the deciding condition."""
    message: str | None = None


class ObjectMeta(ApiModel):
    """The parts of metadata that matter to validation and to `grpojob run`."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    name: str = Field(min_length=1, max_length=MAX_JOB_NAME_LENGTH, pattern=DNS_LABEL)
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    creation_timestamp: datetime | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    """Kueue's `kueue.x-k8s.io/queue-name` and `kueue.x-k8s.io/priority-class` are read from here."""


class GRPOJob(ApiModel):
    """A GRPO post-training run."""

    api_version: Literal["grpo.dev/v1alpha1"] = API_VERSION  # type: ignore[assignment]
    kind: Literal["GRPOJob"] = KIND  # type: ignore[assignment]
    metadata: ObjectMeta
    spec: GRPOJobSpec
    status: GRPOJobStatus | None = None
