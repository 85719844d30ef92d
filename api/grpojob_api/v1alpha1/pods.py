"""How the job's pods are shaped: the Ray worker pods' resources, the images, and each role's scheduling
(`spec.scheduling`: node selectors, tolerations, affinity, priority, scheduler, labels and annotations).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    model_validator,
)

from grpojob_api.quantity import parse_quantity
from grpojob_api.v1alpha1.base import (
    LABEL_VALUE,
    MAX_LABEL_VALUE_LENGTH,
    ApiModel,
    Quantity,
    cel,
    cel_rules,
)


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
    per GPU, 8Gi for a CPU pod. A model loads through host memory: a 7B model's full fine-tune needs more. A
    checkpoint copies the policy's state into host memory and is written while training goes on; a full
    fine-tune's state (its parameters and AdamW moments, 12 bytes a parameter: about 18 GB for a 1.5B model) that
    would not fit beside the pod's processes is written from the GPU tensor by tensor instead, and its step waits
    for the write: give such a pod that much more (48Gi for 1.5B on one GPU) to keep checkpoints off the steps."""
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


class ImagesSpec(ApiModel):
    """Container images; each defaults to the operator's setting."""

    ray: str | None = None
    """Image of the Ray head and workers (trainer image with Ray, vLLM, PyTorch)."""
    trainer: str | None = None
    """Image of the trainer Job (defaults to `ray`)."""
    environment: str | None = None
    """Default image of environment servers."""


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
    dict[str, Annotated[str, Field(max_length=MAX_LABEL_VALUE_LENGTH, pattern=LABEL_VALUE)]],
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
