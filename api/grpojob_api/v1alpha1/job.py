"""The GRPOJob itself: its spec, made of the parts beside this module, with the rules that span parts (placement,
outputs, caches, mappings naming environments), its metadata and the object.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import (
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from grpojob_api.v1alpha1.base import (
    API_VERSION,
    DNS_LABEL,
    KIND,
    MAX_JOB_NAME_LENGTH,
    MAX_SECONDS,
    ApiModel,
    PvcSource,
    cel,
    cel_rules,
    label_problem,
)
from grpojob_api.v1alpha1.environments import EnvironmentSpec
from grpojob_api.v1alpha1.generation import (
    COLOCATED_ENGINE_MEMORY_SHARE,
    MAX_COLOCATED_ENGINE_MEMORY_SHARE,
    SPLIT_ENGINE_MEMORY_SHARE,
    GenerationSpec,
    Placement,
)
from grpojob_api.v1alpha1.model_and_data import DatasetSource, DatasetSpec, ModelSpec
from grpojob_api.v1alpha1.output import CheckpointSpec, LoggingSpec, OutputFormat, OutputSelect, OutputSpec
from grpojob_api.v1alpha1.pods import ImagesSpec, SchedulingSpec
from grpojob_api.v1alpha1.status import GRPOJobStatus
from grpojob_api.v1alpha1.training import EvaluationSpec, GrpoSpec, TrainingSpec


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


OBJECT_META_FIELDS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)
"""The fields of Kubernetes' ObjectMeta: the API server refuses any other (`kubectl apply`: unknown field)."""


class ObjectMeta(ApiModel):
    """The parts of metadata that matter to validation and to `grpojob run`; the others of Kubernetes' ObjectMeta
    pass unread, and what the API server refuses in it is refused here too, so `grpojob run` takes what `kubectl
    apply` takes."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    name: str = Field(min_length=1, max_length=MAX_JOB_NAME_LENGTH, pattern=DNS_LABEL)
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    creation_timestamp: datetime | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    """Kueue's `kueue.x-k8s.io/queue-name` and `kueue.x-k8s.io/priority-class` are read from here."""
    annotations: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_fields(self) -> ObjectMeta:
        unknown = sorted(key for key in self.model_extra or {} if key not in OBJECT_META_FIELDS)
        if unknown:
            raise ValueError(f'unknown field "metadata.{unknown[0]}" (ObjectMeta has no such field)')
        return self

    @field_validator("labels")
    @classmethod
    def _valid_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            if (problem := label_problem(key, value)) is not None:
                raise ValueError(problem)
        return labels

    @field_validator("annotations")
    @classmethod
    def _valid_annotation_keys(cls, annotations: dict[str, str]) -> dict[str, str]:
        for key in annotations:
            if (problem := label_problem(key)) is not None:
                raise ValueError(problem)
        return annotations


class GRPOJob(ApiModel):
    """A GRPO post-training run."""

    api_version: Literal["grpo.dev/v1alpha1"] = API_VERSION  # type: ignore[assignment]
    kind: Literal["GRPOJob"] = KIND  # type: ignore[assignment]
    metadata: ObjectMeta
    spec: GRPOJobSpec
    status: GRPOJobStatus | None = None
