"""Weight loading inside vLLM's GPU workers: the `worker_extension_cls` our vLLM engine is started with.

vLLM mixes this class into each of its GPU workers (the processes that hold the model), and the
engine reaches its methods by name through ``collective_rpc``. Every method loads Hugging Face-named
tensors with the model's own ``load_weights`` (which handles vLLM's fused layouts, e.g. q/k/v into one
projection), then synchronises the GPU so the next request sees the new weights. Method names carry a
``grpojob_`` prefix so they never collide with vLLM's own worker methods.

Payloads are pickled by us (bytes), so vLLM's message encoding never needs to know our types.

A LoRA policy sends its adapter instead (PEFT's tensor names, `grpojob_trainer.policy.lora`), by the same
three transports. The worker registers each version in memory with vLLM's LoRA manager under the id of
the weights version (``grpojob_add_adapter_*``): its `_load_adapter`, asked for an id this extension
holds, builds the adapter from those tensors (`LoRAModel.from_lora_tensors`) instead of reading a
directory, so no file is written anywhere. The adapter is built on the worker's GPU, where the tensors
arrive, not in vLLM's usual place for it, pinned host memory: that meant copying a 7B model's rank-64 adapter
(322 MB) out to the host, pinning it and copying it back into the LoRA slots each step, and the sync took
0.3-0.45 s. Requests then name the version (`adapter_request`). The newest `ADAPTERS_KEPT` versions stay
loaded, so a request still running on the previous one finds it.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from typing import Any

import torch

from grpojob_trainer.weight_sync.buckets import WeightBroadcastGroup, device_uuid, open_shared_buckets

ADAPTERS_KEPT = 2
"""Adapter versions a worker keeps loaded: the newest and the one before it."""
IN_MEMORY = "grpojob-in-memory-adapter"
"""The path every adapter request names (vLLM wants one); the adapters themselves never touch a disk."""


def adapter_request(version: int) -> Any:
    """The vLLM ``LoRARequest`` of adapter ``version`` (the weights version that loaded it, from 1). Each
    version has a name of its own: the prefix cache keys blocks by the adapter's name."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(f"grpojob-v{version}", version, IN_MEMORY)


class WeightSyncExtension:
    """Methods added to vLLM's worker (``self`` is the worker: ``self.model_runner``, ``self.device``)."""

    model_runner: Any
    device: torch.device

    def _grpojob_model(self) -> Any:
        return self.model_runner.get_model()

    def grpojob_device_uuid(self) -> str:
        """The UUID of this worker's GPU (how the trainer tells a shared GPU from another one)."""
        return device_uuid(self.device)

    def grpojob_free_bytes(self) -> int:
        """The free memory of this worker's GPU, in bytes (what a sleeping engine left to the policy)."""
        return torch.cuda.mem_get_info(self.device)[0]

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

    # LoRA adapters, in memory

    def _grpojob_adapter_loader(self) -> dict[int, tuple[dict[str, Any], dict[str, torch.Tensor]]]:
        """The adapters sent but not yet built, by id; on first use, the LoRA manager's `_load_adapter` is
        wrapped (on this instance only) to build those from memory."""
        pending = getattr(self, "_grpojob_pending_adapters", None)
        if pending is not None:
            return pending
        pending = self._grpojob_pending_adapters = {}
        manager = self.model_runner.lora_manager
        load_from_directory = manager._load_adapter

        def load(request: Any) -> Any:
            if request.lora_int_id not in pending:
                if request.lora_path == IN_MEMORY:
                    raise RuntimeError(f"adapter version {request.lora_int_id} is no longer loaded in this engine")
                return load_from_directory(request)
            from vllm.lora.peft_helper import PEFTHelper

            config, tensors = pending.pop(request.lora_int_id)
            helper = PEFTHelper.from_dict(config)
            helper.validate_legal(manager.lora_config)
            model = manager._adapter_manager.model
            mapper = getattr(model, "hf_to_vllm_mapper", None)
            return manager._lora_model_cls.from_lora_tensors(
                lora_model_id=request.lora_int_id,
                tensors=tensors,
                peft_helper=helper,
                device=str(self.device),
                dtype=manager.lora_config.lora_dtype,
                model_vocab_size=manager.vocab_size,
                weights_mapper=mapper.get_unstacked_mapper() if mapper is not None else None,
                skip_prefixes=getattr(model, "lora_skip_prefixes", None),
            )

        manager._load_adapter = load
        return pending

    def _grpojob_add_adapter(
        self, version: int, config: dict[str, Any], named: Iterable[tuple[str, torch.Tensor]]
    ) -> None:
        """Register adapter ``version`` from named tensors (copied on this GPU: the sender's memory may go),
        then drop the versions older than the newest `ADAPTERS_KEPT`."""
        pending = self._grpojob_adapter_loader()
        pending[version] = (config, {name: tensor.to(self.device, copy=True) for name, tensor in named})
        self.model_runner.add_lora(adapter_request(version))
        for old in self.model_runner.list_loras():
            if old <= version - ADAPTERS_KEPT:
                self.model_runner.remove_lora(old)

    def grpojob_add_adapter_tensors(self, version: int, config: dict[str, Any], payload: bytes) -> None:
        """Register an adapter sent as pickled ``[(name, tensor), ...]`` (the object-store path)."""
        self._grpojob_add_adapter(version, config, pickle.loads(payload))

    def grpojob_add_adapter_ipc(self, version: int, config: dict[str, Any], payload: bytes) -> None:
        """Register an adapter whose buckets the policy shares by CUDA IPC (same GPU)."""
        self._grpojob_add_adapter(version, config, open_shared_buckets(payload))

    def grpojob_add_adapter_from_group(self, version: int, config: dict[str, Any], payload: bytes) -> None:
        """Receive an adapter's buckets (pickled ``[layout, ...]``) from the broadcast group and register it."""
        group: WeightBroadcastGroup = self._grpojob_group
        self._grpojob_add_adapter(version, config, group.receive_buckets(pickle.loads(payload), self.device))
