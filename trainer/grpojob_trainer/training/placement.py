"""Placing a job's generation engines and policy ranks on Ray by its layout (`grpojob_api.placement`): the one
code path of `grpojob run` and of the trainer pod on Kubernetes.

Engines ask for one unit of the `generation` Ray resource and ranks for one of `policy`, which only the pods
of their worker group offer (or a local head declares). Colocated, engine i and rank i share the GPU of one
bundle of a placement group (the bundle reserves that GPU and one unit of each resource, so both land on the
same pod and the same GPU, however many GPUs a machine has); each takes half of it in Ray's count, while
vLLM's own share of its memory is `spec.generation.gpuMemoryUtilization` (`GRPOJobSpec.engine_memory_share`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpojob_api import endpoints
from grpojob_api import v1alpha1 as api
from grpojob_api.placement import Layout
from grpojob_trainer.cluster.workers import GENERATION, POLICY, WorkerName, WorkerWatch
from grpojob_trainer.generation.config import EngineConfig
from grpojob_trainer.generation.group import GenerationGroup
from grpojob_trainer.generation.worker import GenerationWorker
from grpojob_trainer.policy.config import RankConfig
from grpojob_trainer.policy.group import PolicyGroup
from grpojob_trainer.policy.worker import PolicyWorker
from grpojob_trainer.training.stop import StopRequest


@dataclass(frozen=True)
class PlacedActors:
    """The engines (serving) and the policy's ranks (started, model loaded)."""

    generation: GenerationGroup
    policy: PolicyGroup


def place_actors(
    layout: Layout,
    spec: api.GRPOJobSpec,
    model_path: str,
    *,
    host: str,
    port: int | None,
    seed: int,
    evaluation_token: str | None = None,
    timeout_s: float | None = None,
    compile_cache_dir: str | None = None,
) -> PlacedActors:
    """Start ``layout``'s engines (serving on ``host``:``port``, a free port when None; engine i samples with
    seed ``seed + i``) and its policy ranks, the ranks once the engines serve when they share GPUs. Each actor
    gets its config (`EngineConfig`, `RankConfig`) built here from ``spec``; ranks that compile their layers keep
    the compiled kernels in ``compile_cache_dir``. Returns once every rank has loaded the model and every engine
    serves; ``timeout_s`` bounds the wait for the worker pods (their images and GPUs)."""
    import ray

    strategies = _colocated_bundles(layout, timeout_s) if layout.colocated else [None] * max(layout.ranks, 1)
    shares_gpu = layout.colocated and layout.gpus_per_engine > 0

    def on(group: str, gpus: float, index: int) -> dict[str, Any]:
        """Ray options of actor ``index`` of ``group``: its GPUs, a unit of the group's resource, its bundle."""
        strategy = strategies[index % len(strategies)]
        return {"num_cpus": 0, "num_gpus": gpus, "resources": {group: 1}, "scheduling_strategy": strategy}

    engine_config = EngineConfig.from_spec(
        spec, model_path, seed=seed, shares_gpu=shares_gpu, evaluation_token=evaluation_token
    )
    engine, rank = ray.remote(GenerationWorker), ray.remote(PolicyWorker)
    engines = [
        engine.options(**on(endpoints.GENERATION_GROUP, layout.gpus_per_engine, i)).remote(
            engine_config.for_engine(i), host, port
        )
        for i in range(layout.engines)
    ]
    generation = None
    if shares_gpu:
        # vLLM measures the GPU's free memory while it starts: a rank loading beside it would skew that.
        generation = GenerationGroup.start(engines, timeout_s=timeout_s)
    ranks = [
        rank.options(**on(endpoints.POLICY_GROUP, layout.gpus_per_rank, i)).remote(
            RankConfig(spec, model_path, seed, rank=i, world=layout.ranks, compile_cache_dir=compile_cache_dir)
        )
        for i in range(layout.ranks)
    ]
    policy = PolicyGroup.start(ranks, timeout_s=timeout_s)
    return PlacedActors(generation or GenerationGroup.start(engines, timeout_s=timeout_s), policy)


def watch_workers(placed: PlacedActors, stop: StopRequest) -> WorkerWatch:
    """Watch the placed engines and ranks; the first one lost stops the run (`StopRequest.worker_lost`). Stop the
    watch before Ray shuts down, which ends the workers too."""
    workers = {WorkerName(POLICY, i): rank for i, rank in enumerate(placed.policy.ranks)}
    workers |= {WorkerName(GENERATION, i): engine for i, engine in enumerate(placed.generation.engines)}
    stop.worker_watch = WorkerWatch(workers, stop.worker_lost)
    return stop.worker_watch.start()


def _colocated_bundles(layout: Layout, timeout_s: float | None) -> list[Any]:
    """One placement-group bundle per engine and rank pair (a GPU when they have one, and a unit of each
    group's resource), reserved; the scheduling strategy of each."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundle: dict[str, float] = {endpoints.GENERATION_GROUP: 1, endpoints.POLICY_GROUP: 1}
    if layout.gpus_per_rank:
        bundle["GPU"] = 1
    group = placement_group([dict(bundle) for _ in range(layout.ranks)], strategy="PACK")
    ray.get(group.ready(), timeout=timeout_s)
    return [PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i) for i in range(layout.ranks)]
