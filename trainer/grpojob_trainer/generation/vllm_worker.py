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
from typing import Any

import torch

from grpojob_trainer.weights import (
    WeightBroadcastGroup,
    device_uuid,
    local_device_index,
    open_shared_tensor,
    unpack_bucket,
)


class WeightSyncExtension:
    """Methods added to vLLM's worker (``self`` is the worker: ``self.model_runner``, ``self.device``)."""

    model_runner: Any
    device: torch.device

    def _grpojob_model(self) -> Any:
        return self.model_runner.get_model()

    def grpojob_device_uuid(self) -> str:
        """The UUID of this worker's GPU (how the trainer tells a shared GPU from another one)."""
        return device_uuid(self.device)

    def grpojob_load_tensors(self, payload: bytes) -> int:
        """Load pickled ``[(name, tensor), ...]`` (CPU tensors: the object-store path)."""
        named = pickle.loads(payload)
        self._grpojob_model().load_weights(iter(named))
        torch.cuda.synchronize(self.device)
        return len(named)

    def grpojob_load_ipc(self, payload: bytes) -> int:
        """Load buckets shared by CUDA IPC: pickled ``(gpu_uuid, [(layout, handle), ...])``."""
        uuid, buckets = pickle.loads(payload)
        index = local_device_index(uuid)
        model = self._grpojob_model()
        loaded = 0
        for layout, handle in buckets:
            flat = open_shared_tensor(handle, index)
            named = unpack_bucket(layout, flat)
            model.load_weights(iter(named))
            loaded += len(named)
            del flat, named
        torch.cuda.synchronize(self.device)
        return loaded

    def grpojob_join_weight_group(self, host: str, port: int, world_size: int, rank: int) -> None:
        """Join the policy's broadcast group (NCCL) as ``rank``."""
        torch.cuda.set_device(self.device)
        self._grpojob_group = WeightBroadcastGroup(host, port, world_size=world_size, rank=rank, backend="nccl")

    def grpojob_load_from_group(self, payload: bytes) -> int:
        """Receive pickled ``[layout, ...]`` buckets from the broadcast group and load each as it arrives."""
        layouts = pickle.loads(payload)
        group: WeightBroadcastGroup = self._grpojob_group
        loaded = 0
        model = self._grpojob_model()
        for layout in layouts:
            flat = torch.empty(layout.numel, dtype=layout.torch_dtype, device=self.device)
            group.broadcast(flat)
            named = unpack_bucket(layout, flat)
            model.load_weights(iter(named))
            loaded += len(named)
        torch.cuda.synchronize(self.device)
        return loaded
