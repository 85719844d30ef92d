"""Weight loading inside vLLM's GPU workers: the `worker_extension_cls` our vLLM engine is started with.

vLLM mixes this class into each of its GPU workers (the processes that hold the model), and the
engine reaches its methods by name through ``collective_rpc``. Every method loads Hugging Face-named
tensors with the model's own ``load_weights`` (which handles vLLM's fused layouts, e.g. q/k/v into one
projection), then synchronises the GPU so the next request sees the new weights. Method names carry a
``grpojob_`` prefix so they never collide with vLLM's own worker methods.

Payloads are pickled by us (bytes), so vLLM's message encoding never needs to know our types.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from typing import Any

import torch

from grpojob_trainer.weight_sync.buckets import WeightBroadcastGroup, device_uuid, open_shared_buckets


class WeightSyncExtension:
    """Methods added to vLLM's worker (``self`` is the worker: ``self.model_runner``, ``self.device``)."""

    model_runner: Any
    device: torch.device

    def _grpojob_model(self) -> Any:
        return self.model_runner.get_model()

    def grpojob_device_uuid(self) -> str:
        """The UUID of this worker's GPU (how the trainer tells a shared GPU from another one)."""
        return device_uuid(self.device)

    def _grpojob_load(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load named tensors (consumed lazily, bucket by bucket) and wait until the GPU has them."""
        self._grpojob_model().load_weights(iter(named))
        torch.cuda.synchronize(self.device)

    def grpojob_load_tensors(self, payload: bytes) -> None:
        """Load pickled ``[(name, tensor), ...]`` (CPU tensors: the object-store path)."""
        self._grpojob_load(pickle.loads(payload))

    def grpojob_load_ipc(self, payload: bytes) -> None:
        """Load buckets shared by CUDA IPC (`grpojob_trainer.weight_sync.buckets.share_buckets`), in place."""
        self._grpojob_load(open_shared_buckets(payload))

    def grpojob_join_weight_group(self, host: str, port: int, world_size: int, rank: int) -> None:
        """Join the policy's broadcast group (NCCL) as ``rank``."""
        torch.cuda.set_device(self.device)
        self._grpojob_group = WeightBroadcastGroup(host, port, world_size=world_size, rank=rank, backend="nccl")

    def grpojob_load_from_group(self, payload: bytes) -> None:
        """Receive pickled ``[layout, ...]`` buckets from the broadcast group and load each as it arrives."""
        group: WeightBroadcastGroup = self._grpojob_group
        self._grpojob_load(group.receive_buckets(pickle.loads(payload), self.device))
