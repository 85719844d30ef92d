"""Training and GRPO: `spec.training` (the policy's workers, optimizer and LoRA adapter), `spec.grpo` (the
algorithm) and `spec.evaluation` (held-out rows evaluated while training).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import (
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from grpojob_api.v1alpha1.base import (
    ApiModel,
    cel,
    cel_rules,
    given,
)
from grpojob_api.v1alpha1.model_and_data import DatasetSource
from grpojob_api.v1alpha1.pods import WorkerResources


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
    gradient_checkpointing: bool | None = None
    """Recompute activations in the backward pass: less memory for longer sequences, about a third more
    compute. Unset: on GPUs, only the micro-batches whose activations would not fit the GPU's free memory
    recompute them (the others keep them and run at full speed); off on the CPU."""
    torch_compile: bool | None = None
    """On GPUs: compile each decoder layer with `torch.compile` (dynamic shapes). On the H200 the training
    phase ran about 1.4x faster with it; the first step spends 10-20 s compiling (less when the compiled
    kernels are already in `<checkpoint directory>/compile-cache`, where a retry or a resumed job finds
    them), and the trainer image needs a C compiler (Triton builds its launchers). Unset: on when the
    policy trains on GPUs; `false` turns it off. Ignored on the CPU."""
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
                given("maxOffPolicySteps") + "self.maxOffPolicySteps == 0 || has(self.importanceSamplingCap)",
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
