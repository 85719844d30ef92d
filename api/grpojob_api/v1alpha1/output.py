"""Output and tracking: `spec.checkpointing`, `spec.output` (the trained model as a model directory or an
adapter) and `spec.logging` (TensorBoard, MLflow, W&B).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import (
    ConfigDict,
    Field,
    model_validator,
)

from grpojob_api.v1alpha1.base import (
    ApiModel,
    PvcSource,
    SecretKeyRef,
    VolumePath,
    cel,
    cel_rules,
    given,
)

DEFAULT_GRACE_PERIOD_SECONDS = 120
"""The least grace period the trainer pod gets when `spec.checkpointing.gracePeriodSeconds` is unset: Kubernetes'
default of 30 s is shorter than the checkpoint of a 7B model's weights and optimizer state."""
GRACE_PERIOD_ROUNDING_SECONDS = 60
"""A grace period fitted to what a stop needs is rounded up to a whole minute, so that a retry's pod keeps the
grace period of the one before unless the estimate moved by more than a few seconds."""
MAX_GRACE_PERIOD_SECONDS = 86400
"""The longest grace period, fitted or asked for: a day."""


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
    grace_period_seconds: int | None = Field(default=None, ge=1, le=MAX_GRACE_PERIOD_SECONDS)
    """How long the trainer has once its pod is told to stop (an eviction, a node drain, Kueue's preemption,
    a spot notice surfaced as the pod's deletion): it abandons a step still collecting rollouts or finishes
    one already training, lets the checkpoint write in flight finish, writes the checkpoint of its last
    completed step, and exits as preempted, which the operator retries without counting against
    `backoffLimit`. The trainer pod's `terminationGracePeriodSeconds`. Unset: 120 s for the first attempt, and
    for a retry what the trainer measured a stop to need (`status.checkpointing.stopSeconds`, from its
    checkpoints' writes and its training steps) rounded up to a whole minute, never less than 120 s. A value
    below that estimate puts the condition `GracePeriodTooShort` on the job, with a Warning event: a trainer
    stopped on notice may then be killed before its last checkpoint is on disk, and lose its last steps."""

    def grace_period(self, stop_seconds: int | None = None) -> int:
        """The trainer pod's grace period: `gracePeriodSeconds` if set; else one that fits ``stop_seconds`` (what
        the trainer last measured a stop to need; None: nothing measured yet), rounded up to a whole minute, and
        never below `DEFAULT_GRACE_PERIOD_SECONDS`."""
        if self.grace_period_seconds is not None:
            return self.grace_period_seconds
        if stop_seconds is None:
            return DEFAULT_GRACE_PERIOD_SECONDS
        minutes = -(-stop_seconds // GRACE_PERIOD_ROUNDING_SECONDS)
        return min(max(DEFAULT_GRACE_PERIOD_SECONDS, minutes * GRACE_PERIOD_ROUNDING_SECONDS), MAX_GRACE_PERIOD_SECONDS)


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
            cel(given("mode") + "self.mode != 'online' || has(self.apiKeySecret)", _WANDB_ONLINE_NEEDS_KEY)
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
