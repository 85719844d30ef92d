"""How the driver moves the policy's weights to the generation engines after every step.

Three paths, picked once per run by `weight_sync_for` from where the actors are:

- `ObjectStoreSync`: the policy's tensors, copied to the CPU, go through the Ray object store (one put,
  every engine reads it). The path of CPU jobs and of the transformers backend.
- `CudaIpcSync`: each vLLM engine on the GPU of a policy rank (colocated). That rank packs the parameters
  into bfloat16 buckets on its GPU and hands the engine CUDA IPC handles; the engine's workers load
  straight from the rank's memory. Nothing crosses the host, and the handles go from the rank's actor to
  the engine's without a stop at the driver.
- `NcclBroadcastSync`: engines on other GPUs. Policy (rank 0) and every engine join an NCCL group once;
  each sync broadcasts the buckets, which the engines load as they arrive.

What travels (`choose_content`): every parameter of a fully fine-tuned policy; a LoRA policy's adapter
alone when every engine serves LoRA (a few MB to a few hundred: the base never moves); otherwise, chosen
at start and logged, the LoRA policy's adapter merged into its base, as full weights.

Engines that share the policy's GPU and can sleep (`spec.generation.sleepWhileTraining`) are put to sleep
by `release` once their batch is done and before the policy trains (vLLM's sleep mode: level 2, weights and
KV cache dropped, for full weights, which are replaced after the step anyway; level 1, weights kept in host
memory, for an adapter, whose base must survive); the policy frees its cached memory and the next `push`
wakes their weights, loads the new ones and wakes their KV cache. `release` reports
``weight_sync/sleep_seconds`` and ``weight_sync/free_gib_while_training`` (the GPU's free memory left to
training); the other paths have nothing to release.

Each `push` returns when every engine serves the new weights, with ``weight_sync/seconds`` (wall time
seen by the driver), ``weight_sync/version`` (the weights version the engines now serve, the oldest of
theirs) and, on the NCCL path, ``weight_sync/bytes`` (what was broadcast). The policy is anything with the
methods of `PolicyWeights` (`grpojob_trainer.policy.group.PolicyGroup`: with several ranks all of them gather
the sharded weights and rank 0 sends them).
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

DEFAULT_BUCKET_BYTES = 512 << 20
"""Bucket size of the GPU paths: large enough for few collectives, small enough to bound the extra memory
of one NCCL bucket on each side."""


WEIGHTS, ADAPTER, MERGED = "weights", "adapter", "merged"
"""What a push carries (`grpojob_trainer.policy.worker.SyncContent`)."""


@dataclass(frozen=True)
class Content:
    """What the policy sends: ``kind`` (`WEIGHTS`, `ADAPTER` or `MERGED`) and, for an adapter, its config."""

    kind: str = WEIGHTS
    adapter_config: dict[str, Any] | None = None

    def receive(self, engine: Any, method: str, *args: Any) -> Any:
        """``engine``'s receiving call for this content (``update_weights<method>`` or, for an adapter,
        ``update_adapter<method>`` with the config first), started: its ObjectRef."""
        if self.kind == ADAPTER:
            return getattr(engine, f"update_adapter{method}").remote(self.adapter_config, *args)
        return getattr(engine, f"update_weights{method}").remote(*args)


class PolicyWeights(Protocol):
    """The policy as the weight paths see it: what each path asks of it to send its weights."""

    def adapter_config(self) -> dict[str, Any] | None: ...
    def device_uuids(self) -> list[str | None]: ...
    def weights(self, content: str = WEIGHTS) -> Any: ...
    def free_cached_memory(self) -> None: ...
    def share_weights_ipc(
        self, bucket_bytes: int, content: str = WEIGHTS, sharing: Collection[int] = (0,)
    ) -> list[Any]: ...
    def release_shared_weights(self) -> None: ...
    def weight_group_address(self) -> tuple[str, int]: ...
    def join_weight_group(self, host: str, port: int, world_size: int, receivers: Sequence[Any] = ()) -> list[Any]: ...
    def bucket_layouts(self, bucket_bytes: int, content: str = WEIGHTS) -> list[Any]: ...
    def broadcast_weights(
        self, bucket_bytes: int, receivers: Sequence[Any] = (), content: str = WEIGHTS
    ) -> tuple[int, list[Any]]: ...


class WeightSync(Protocol):
    name: str

    def push(self) -> dict[str, float]:
        """Send the policy's current weights to every engine; return when all of them use them."""

    def release(self) -> dict[str, float]:
        """Before the policy trains, with no request in flight: free what the engines hold on the policy's
        GPU, if they share it and can sleep (the next `push` takes it back)."""


class NothingToRelease:
    """A weight path whose engines keep their memory while the policy trains."""

    def release(self) -> dict[str, float]:
        return {}


class ObjectStoreSync(NothingToRelease):
    """Through the Ray object store (host memory)."""

    name = "object-store"

    def __init__(self, policy: PolicyWeights, engines: list[Any], content: Content = Content()) -> None:
        self.policy, self.engines, self.content = policy, engines, content

    def push(self) -> dict[str, float]:
        import ray

        started = time.perf_counter()
        weights = self.policy.weights(self.content.kind)
        versions = ray.get([self.content.receive(engine, "", weights) for engine in self.engines])
        return {"weight_sync/seconds": time.perf_counter() - started, "weight_sync/version": float(min(versions))}


class CudaIpcSync:
    """Buckets shared by CUDA IPC handles: policy and engines on one GPU."""

    name = "cuda-ipc"

    def __init__(
        self,
        policy: PolicyWeights,
        engines: list[Any],
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        content: Content = Content(),
        sleep: bool = False,
        sources: list[int] | None = None,
    ) -> None:
        self.policy, self.engines, self.bucket_bytes, self.content = policy, engines, bucket_bytes, content
        self.sources = sources or [0] * len(engines)
        """For each engine, the policy rank on its GPU, whose buckets it loads."""
        self.sleep = sleep
        """Whether the engines sleep while the policy trains."""
        self.asleep = False

    def release(self) -> dict[str, float]:
        import ray

        if not self.sleep or self.asleep:
            return {}
        started = time.perf_counter()
        free = ray.get([engine.sleep.remote(sleep_level(self.content.kind)) for engine in self.engines])
        self.asleep = True
        return {
            "weight_sync/sleep_seconds": time.perf_counter() - started,
            "weight_sync/free_gib_while_training": min(free) / 2**30,
        }

    def push(self) -> dict[str, float]:
        import ray

        started = time.perf_counter()
        asleep, self.asleep = self.asleep, False
        if asleep:  # the training step's cached memory goes back to the GPU before the engines take theirs
            self.policy.free_cached_memory()
            ray.get([engine.wake_up.remote(["weights"]) for engine in self.engines])
        try:
            shared = self.policy.share_weights_ipc(self.bucket_bytes, self.content.kind, set(self.sources))
            loads = [
                self.content.receive(engine, "_ipc", shared[source])
                for engine, source in zip(self.engines, self.sources, strict=True)
            ]
            versions = ray.get([*shared, *loads])[len(shared) :]
        finally:
            if self.content.kind != ADAPTER:  # an adapter's buckets are kept and refilled at the next push
                self.policy.release_shared_weights()
        if asleep:
            self.policy.free_cached_memory()  # the shared buckets' memory
            ray.get([engine.wake_up.remote(["kv_cache"]) for engine in self.engines])
        return {"weight_sync/seconds": time.perf_counter() - started, "weight_sync/version": float(min(versions))}


def sleep_level(content: str) -> int:
    """vLLM's sleep level for engines about to receive ``content``: 2 (drop the weights) for full weights,
    which replace every parameter; 1 (keep them in host memory) for an adapter, which needs its base."""
    return 1 if content == ADAPTER else 2


class NcclBroadcastSync(NothingToRelease):
    """Buckets broadcast over NCCL from the policy's GPU to the engines' GPUs."""

    name = "nccl-broadcast"

    def __init__(
        self,
        policy: PolicyWeights,
        engines: list[Any],
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        content: Content = Content(),
    ) -> None:
        self.policy, self.engines, self.bucket_bytes, self.content = policy, engines, bucket_bytes, content
        host, port = policy.weight_group_address()
        world = 1 + len(engines)
        joins = [engine.join_weight_group.remote(host, port, world, rank) for rank, engine in enumerate(engines, 1)]
        policy.join_weight_group(host, port, world, receivers=joins)
        self.layouts_payload = pickle.dumps(policy.bucket_layouts(bucket_bytes, content.kind))

    def push(self) -> dict[str, float]:
        started = time.perf_counter()
        receivers = [self.content.receive(engine, "_from_group", self.layouts_payload) for engine in self.engines]
        sent, versions = self.policy.broadcast_weights(
            self.bucket_bytes, receivers=receivers, content=self.content.kind
        )
        return {
            "weight_sync/seconds": time.perf_counter() - started,
            "weight_sync/bytes": float(sent),
            "weight_sync/version": float(min(versions)),
        }


def choose_path(policy_gpus: list[str | None], engines: list[dict[str, Any]]) -> str:
    """The path for a policy whose ranks are on GPUs ``policy_gpus`` (None: the CPU) and engines described by
    their ``weight_sync_info`` (backend, device UUIDs): object-store, cuda-ipc or nccl-broadcast."""
    if policy_gpus[0] is None or any(e["backend"] != "vllm" for e in engines):
        return ObjectStoreSync.name
    if ipc_sources(policy_gpus, engines) is not None:
        return CudaIpcSync.name
    if all(len(e["device_uuids"]) == 1 and e["device_uuids"][0] not in policy_gpus for e in engines):
        return NcclBroadcastSync.name
    return ObjectStoreSync.name  # tensor-parallel engines, or some sharing a rank's GPU and some not


def ipc_sources(policy_gpus: list[str | None], engines: list[dict[str, Any]]) -> list[int] | None:
    """For each engine, the policy rank on its one GPU (the rank whose buckets it opens by CUDA IPC); None
    unless every engine has such a rank."""
    sources = []
    for engine in engines:
        uuids = engine["device_uuids"]
        if len(uuids) != 1 or uuids[0] not in policy_gpus:
            return None
        sources.append(policy_gpus.index(uuids[0]))
    return sources


def choose_content(lora: bool, engines: list[dict[str, Any]]) -> str:
    """What a policy (``lora``: a LoRA policy) sends engines described by their ``weight_sync_info``: every
    parameter, the adapter (every engine serves LoRA), or the adapter merged into the base."""
    if not lora:
        return WEIGHTS
    return ADAPTER if all(e.get("lora") for e in engines) else MERGED


def weight_sync_for(policy: PolicyWeights, engines: list[Any], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> WeightSync:
    """The weight path for these actors (see `choose_path` and `choose_content`), set up and ready to `push`."""
    import ray

    policy_gpus = policy.device_uuids()
    adapter_config = policy.adapter_config()
    infos = ray.get([engine.weight_sync_info.remote() for engine in engines])
    path = choose_path(policy_gpus, infos)
    content = Content(choose_content(adapter_config is not None, infos), adapter_config)
    log.info("weight sync: %s of the %s (policy GPUs %s, engines %s)", path, content.kind, policy_gpus, infos)
    if content.kind == MERGED:
        log.warning("the engines cannot serve LoRA adapters: the policy sends its adapter merged into the base")
    if path == CudaIpcSync.name:
        sleep = all(info.get("sleeps") for info in infos)
        if sleep:
            log.info("the engines sleep while the policy trains (level %d)", sleep_level(content.kind))
        return CudaIpcSync(policy, engines, bucket_bytes, content, sleep, ipc_sources(policy_gpus, infos))
    if path == NcclBroadcastSync.name:
        return NcclBroadcastSync(policy, engines, bucket_bytes, content)
    return ObjectStoreSync(policy, engines, content)
