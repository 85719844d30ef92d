"""What a policy rank is started with, built once on the driver and handed to its Ray actor: the validated spec,
the model, the seed, the rank's place among the ranks and where compiled kernels are kept."""

from __future__ import annotations

from dataclasses import dataclass

from grpojob_api import v1alpha1 as api


@dataclass(frozen=True)
class RankConfig:
    """One rank of the policy (`PolicyWorker`)."""

    spec: api.GRPOJobSpec
    """The job's spec, validated once where the job was read."""
    model_path: str
    seed: int
    rank: int = 0
    """This rank's index, 0 being the one that sends the weights to the engines."""
    world: int = 1
    """How many ranks the policy has."""
    compile_cache_dir: str | None = None
    """Where compiled kernels are kept across steps and attempts (`compilation.compile_cache_dir` of the job's
    checkpoint directory), when the layers are compiled; None: TorchInductor's own default."""
