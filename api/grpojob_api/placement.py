"""Where a job's generation engines and policy ranks run: read alike by the operator (the RayCluster's
worker groups and the resources each pod offers Ray) and by the trainer (the actors it places on them, in
the cluster and under `grpojob run`), so the two never disagree.

`split` gives the engines a `generation` worker group and the ranks a `policy` group, each pod offering one
unit of its group's Ray resource per engine or rank. `colocated` has one `colocated` group whose every pod
offers one unit of both, and each engine and rank take half of the GPU they share.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpojob_api import endpoints
from grpojob_api import v1alpha1 as api

SHARED_GPU = 0.5
"""The Ray GPU share of a colocated engine, and of the rank beside it."""


@dataclass(frozen=True)
class WorkerGroup:
    """One worker group of the RayCluster."""

    name: str
    replicas: int
    """Pods of the group."""
    gpus: int
    """GPUs of each pod."""
    ray_resources: dict[str, int]
    """The custom Ray resources each pod offers (the trainer asks for one unit per actor)."""


@dataclass(frozen=True)
class Layout:
    """The engines and ranks of a job, and the worker groups that hold them."""

    placement: api.Placement
    engines: int
    gpus_per_engine: float
    """Ray GPUs of each engine: its tensor-parallel GPUs, a share beside a rank, or 0 on the CPU."""
    ranks: int
    gpus_per_rank: float
    """Ray GPUs of each policy rank: 1, a share beside an engine, or 0 on the CPU."""
    groups: tuple[WorkerGroup, ...]

    @property
    def colocated(self) -> bool:
        return self.placement == api.Placement.COLOCATED

    @property
    def gpus(self) -> int:
        """GPUs of every worker pod together."""
        return sum(group.replicas * group.gpus for group in self.groups)

    @property
    def ray_resources(self) -> dict[str, int]:
        """The custom Ray resources of every worker pod together: what a local Ray head declares."""
        total: dict[str, int] = {}
        for group in self.groups:
            for name, units in group.ray_resources.items():
                total[name] = total.get(name, 0) + units * group.replicas
        return total


def layout(spec: api.GRPOJobSpec) -> Layout:
    """Where ``spec``'s engines and ranks run (`spec.resolved_placement`)."""
    generation, training = spec.generation, spec.training
    placement = spec.resolved_placement
    if placement == api.Placement.COLOCATED:
        gpus = training.gpus_per_replica  # 0 or 1: the model refuses more
        share = SHARED_GPU if gpus else 0.0
        group = WorkerGroup(
            endpoints.COLOCATED_GROUP,
            training.replicas,
            gpus,
            {endpoints.GENERATION_GROUP: 1, endpoints.POLICY_GROUP: 1},
        )
        return Layout(placement, generation.replicas, share, training.ranks, share, (group,))
    groups = (
        WorkerGroup(
            endpoints.GENERATION_GROUP,
            generation.replicas,
            generation.gpus_per_replica,
            {endpoints.GENERATION_GROUP: 1},
        ),
        WorkerGroup(
            endpoints.POLICY_GROUP,
            training.replicas,
            training.gpus_per_replica,
            {endpoints.POLICY_GROUP: training.ranks_per_replica},
        ),
    )
    return Layout(
        placement,
        generation.replicas,
        float(generation.gpus_per_replica),
        training.ranks,
        float(min(1, training.gpus_per_replica)),
        groups,
    )
