"""The status of a GRPOJob: its phase, conditions, progress, evaluations and the model it exported, written
only by the operator's status writer.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import (
    Field,
)

from grpojob_api.v1alpha1.base import (
    ApiModel,
)
from grpojob_api.v1alpha1.generation import Placement
from grpojob_api.v1alpha1.output import OutputFormat


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
    GRACE_PERIOD_TOO_SHORT = "GracePeriodTooShort"
    """`spec.checkpointing.gracePeriodSeconds` is shorter than what the trainer measured a stop to need
    (`status.checkpointing.stopSeconds`): a trainer stopped on notice may lose its last steps."""


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


class CheckpointingStatus(ApiModel):
    """What the trainer measured of its checkpoints and steps, and what a stop on notice needs by that measure."""

    stop_seconds: int = Field(ge=1)
    """About how long the trainer needs once its pod is told to stop: the training of one step, the write of the
    checkpoint in flight, the copy and write of the last step's checkpoint, a quarter more and 30 s. With
    `spec.checkpointing.gracePeriodSeconds` unset, a retry's trainer pod gets this as its grace period, rounded up
    to a whole minute (at least 120 s)."""
    write_seconds: float = Field(ge=0)
    """The slowest of the trainer's recent checkpoint writes (`time/checkpoint_write`)."""
    training_seconds: float = Field(ge=0)
    """The slowest of the trainer's recent training phases (a step's policy update)."""
    bytes: int | None = Field(default=None, ge=0)
    """The size of the newest checkpoint written (its weights, optimizer state and the rest)."""


class GRPOJobStatus(ApiModel):
    """Observed state of a GRPOJob, written only by the operator's status writer."""

    phase: Phase = Phase.PENDING
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = None
    attempt: int = 0
    """Trainer attempt, counted from 1; incremented on each retry."""
    preemptions: int = 0
    """Attempts that ended because the trainer pod was told to stop (an eviction, a node drain, a preemption),
    its last completed step checkpointed, or because a Ray worker's node left the cluster mid-run (its pod deleted,
    its machine reclaimed): retried without counting against `spec.backoffLimit`."""
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
    checkpointing: CheckpointingStatus | None = None
    """What a stop of the trainer needs, as it measured its checkpoints' writes and its steps (the last attempt
    that wrote a checkpoint): what the trainer pod's grace period should leave room for."""
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
