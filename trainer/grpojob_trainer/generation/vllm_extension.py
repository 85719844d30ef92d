"""Weight loading inside vLLM's GPU workers: the `worker_extension_cls` our vLLM engine is started with.

vLLM mixes this class into each of its GPU workers (the processes that hold the model), and the
engine reaches its methods by name through ``collective_rpc``. Every method loads Hugging Face-named
tensors with the model's own ``load_weights`` (which handles vLLM's fused layouts, e.g. q/k/v into one
projection), then synchronises the GPU so the next request sees the new weights. Method names carry a
``grpojob_`` prefix so they never collide with vLLM's own worker methods.

Payloads are pickled by us (bytes), so vLLM's message encoding never needs to know our types.

A LoRA policy sends its adapter instead (PEFT's tensor names, `grpojob_trainer.policy.lora`), by the same
three transports. Versions take turns on `ADAPTERS_KEPT` vLLM LoRA ids (`adapter_slot`), each version under a
name of its own (the prefix cache keys blocks by the adapter's name), so the newest versions stay loaded and
a request still running on the previous one finds it. The first time an id is used (and whenever the
in-place path below cannot be used) the worker registers the version with vLLM's LoRA manager: its
`_load_adapter`, asked for an id this extension holds, builds the adapter from those tensors
(`LoRAModel.from_lora_tensors`) on the worker's GPU, where they arrive, instead of reading a directory, so
no file is written anywhere. Building it in vLLM's usual place, pinned host memory, meant copying a 7B
model's rank-64 adapter (322 MB) out to the host and back each step (0.3-0.45 s a sync); building it on the
GPU took 46-63 ms a sync.

After that an id's next versions are written in place (`InPlaceAdapter`): each PEFT tensor is copied
straight into the two places vLLM keeps it, the registered adapter's weights and the GPU slot the LoRA
kernels read, by a few batched copies (scaling folded into B as vLLM folds it). Where each tensor goes is
worked out once per registration from vLLM's module names and packing (q/k/v into qkv_proj, gate/up into
gate_up_proj), and used only after checking that vLLM's own registration put exactly those values there;
layers vLLM slices (tensor parallelism) or places it does not describe fall back to registering.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grpojob_trainer.weight_sync.buckets import WeightBroadcastGroup, device_uuid, open_shared_buckets

ADAPTERS_KEPT = 2
"""Adapter versions a worker keeps loaded: the newest and the one before it."""
IN_MEMORY = "grpojob-in-memory-adapter"
"""The path every adapter request names (vLLM wants one); the adapters themselves never touch a disk."""

log = logging.getLogger(__name__)


def adapter_slot(version: int) -> int:
    """The vLLM LoRA id that serves adapter ``version`` (from 1): versions take turns on ids 1 to
    `ADAPTERS_KEPT`, so a new version replaces the oldest one kept."""
    return 1 + (version - 1) % ADAPTERS_KEPT


def adapter_request(version: int, *, reload: bool = False) -> Any:
    """The vLLM ``LoRARequest`` of adapter ``version``: a name of its own (the prefix cache keys blocks by
    name) on the id of its `adapter_slot`; ``reload``: register it again although that id is registered."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(f"grpojob-v{version}", adapter_slot(version), IN_MEMORY, load_inplace=reload)


def adapter_destinations(
    tensor_modules: Mapping[str, tuple[str, bool]], modules: Collection[str], packed: Mapping[str, Sequence[str]]
) -> dict[str, tuple[str, int]] | None:
    """Where each adapter tensor goes among vLLM's LoRA modules: ``{tensor name: (module, slice)}``.

    ``tensor_modules`` maps each tensor's name to its module's name as vLLM parses it, and whether it is an A
    matrix; ``modules`` are vLLM's LoRA-wrapped modules and ``packed`` its packed ones with their parts, in
    slice order (``…qkv_proj: […q_proj, …k_proj, …v_proj]``). None if any tensor has no place.
    """
    part_of = {part: (module, index) for module, parts in packed.items() for index, part in enumerate(parts)}
    destinations = {}
    for name, (module, _is_a) in tensor_modules.items():
        if module in part_of:
            destinations[name] = part_of[module]
        elif module in modules and module not in packed:
            destinations[name] = (module, 0)
        else:
            return None
    return destinations


@dataclass
class InPlaceAdapter:
    """The places of one registered adapter's tensors in vLLM (its `LoRAModel` weights and its GPU slot
    ``index``), by PEFT tensor name, and `write`, which puts a new version there."""

    lora_model: Any
    index: int
    scaling: float
    names_a: list[str]
    names_b: list[str]
    model_a: list[torch.Tensor]
    model_b: list[torch.Tensor]
    slot_a: list[torch.Tensor]
    slot_b: list[torch.Tensor]

    @classmethod
    def locate(
        cls, adapters: Any, lora_id: int, scaling: float, tensor_modules: Mapping[str, tuple[str, bool]]
    ) -> InPlaceAdapter | None:
        """The places of registered adapter ``lora_id`` in ``adapters`` (vLLM's `LoRAModelManager`), or None
        where vLLM keeps them in a way this does not know (a sliced layer, an unknown module, another shape)."""
        lora_model = adapters.get_adapter(lora_id)
        if lora_model is None or lora_id not in adapters.lora_index_to_id:
            return None
        index = adapters.lora_index_to_id.index(lora_id)
        destinations = adapter_destinations(tensor_modules, adapters.modules, getattr(adapters, "packed_modules", {}))
        if destinations is None:
            return None
        found = cls(lora_model, index, scaling, [], [], [], [], [], [])
        for name, (module, part) in destinations.items():
            layer, weights = adapters.modules[module], lora_model.loras.get(module)
            if weights is None or getattr(layer, "tp_size", 1) != 1:
                return None
            is_a = tensor_modules[name][1]
            kept = weights.lora_a if is_a else weights.lora_b
            kept = kept[part] if isinstance(kept, list) else kept
            stacked = getattr(layer, "lora_a_stacked" if is_a else "lora_b_stacked", ())
            if kept is None or part >= len(stacked) or kept.dim() != 2:
                return None
            rows, columns = kept.shape
            slot = stacked[part][index, 0, :rows, :columns]
            if slot.shape != kept.shape:
                return None
            (found.names_a if is_a else found.names_b).append(name)
            (found.model_a if is_a else found.model_b).append(kept)
            (found.slot_a if is_a else found.slot_b).append(slot)
        return found if found.names_a and found.names_b else None

    def holds(self, tensors: Mapping[str, torch.Tensor]) -> bool:
        """Whether both places hold exactly what `write` would put there from ``tensors``."""
        for names, kept, slots, scale in (
            (self.names_a, self.model_a, self.slot_a, 1.0),
            (self.names_b, self.model_b, self.slot_b, self.scaling),
        ):
            for name, model, slot in zip(names, kept, slots, strict=True):
                expected = tensors[name].to(device=model.device, dtype=model.dtype)
                if scale != 1:
                    expected = expected * scale
                if expected.shape != model.shape or not (torch.equal(model, expected) and torch.equal(slot, expected)):
                    return False
        return True

    def still_registered(self, adapters: Any, lora_id: int) -> bool:
        """Whether vLLM still serves ``lora_id`` from these places (not rebuilt, evicted or moved)."""
        index = self.index
        return (
            adapters.get_adapter(lora_id) is self.lora_model
            and index < len(adapters.lora_index_to_id)
            and adapters.lora_index_to_id[index] == lora_id
        )

    def write(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Put a new version of the adapter (``tensors`` by PEFT name, of the same shapes) in both places:
        cast to vLLM's dtype, B times the scaling, as vLLM's own registration does."""
        device = self.model_a[0].device
        torch._foreach_copy_(self.model_a, [tensors[name].to(device) for name in self.names_a])
        torch._foreach_copy_(self.model_b, [tensors[name].to(device) for name in self.names_b])
        if self.scaling != 1:
            torch._foreach_mul_(self.model_b, self.scaling)
        torch._foreach_copy_(self.slot_a, self.model_a)
        torch._foreach_copy_(self.slot_b, self.model_b)


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
                    raise RuntimeError(f"adapter id {request.lora_int_id} is no longer loaded in this engine")
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
    ) -> bool:
        """Serve adapter ``version`` from named tensors (the sender's memory may go once this returns): written
        in place over the version its id last held, or registered with vLLM (then located for the next time).
        Returns whether it was written in place."""
        tensors = dict(named)
        lora_id = adapter_slot(version)
        adapters = self.model_runner.lora_manager._adapter_manager
        places: dict[int, InPlaceAdapter] = self.__dict__.setdefault("_grpojob_in_place", {})
        found = places.get(lora_id)
        in_place = found is not None and found.still_registered(adapters, lora_id)
        if found is not None and in_place:
            found.write(tensors)
        else:
            places.pop(lora_id, None)
            pending = self._grpojob_adapter_loader()
            pending[lora_id] = (config, {name: tensor.to(self.device, copy=True) for name, tensor in tensors.items()})
            registered = lora_id in self.model_runner.list_loras()
            self.model_runner.add_lora(adapter_request(version, reload=registered))
            located = self._grpojob_locate_adapter(lora_id, config, tensors)
            if located is not None:
                places[lora_id] = located
        torch.cuda.synchronize(self.device)
        return in_place

    def _grpojob_locate_adapter(
        self, lora_id: int, config: dict[str, Any], tensors: Mapping[str, torch.Tensor]
    ) -> InPlaceAdapter | None:
        """The places of the adapter just registered as ``lora_id``, if vLLM put ``tensors`` exactly there
        (else None, logged once: every version is then registered)."""
        if getattr(self, "_grpojob_in_place_refused", False):
            return None
        from vllm.lora.peft_helper import PEFTHelper
        from vllm.lora.utils import parse_fine_tuned_lora_name

        adapters = self.model_runner.lora_manager._adapter_manager
        mapper = getattr(adapters.model, "hf_to_vllm_mapper", None)
        mapper = mapper.get_unstacked_mapper() if mapper is not None else None
        try:
            tensor_modules = {name: parse_fine_tuned_lora_name(name, mapper) for name in tensors}
        except ValueError:
            tensor_modules = None
        scaling = PEFTHelper.from_dict(config).vllm_lora_scaling_factor
        located = tensor_modules and InPlaceAdapter.locate(adapters, lora_id, scaling, tensor_modules)
        if located and located.holds(tensors):
            return located
        self._grpojob_in_place_refused = True
        log.warning("vLLM keeps this adapter in a layout not written in place: every version is registered anew")
        return None

    def grpojob_add_adapter_tensors(self, version: int, config: dict[str, Any], payload: bytes) -> bool:
        """Register an adapter sent as pickled ``[(name, tensor), ...]`` (the object-store path)."""
        return self._grpojob_add_adapter(version, config, pickle.loads(payload))

    def grpojob_add_adapter_ipc(self, version: int, config: dict[str, Any], payload: bytes) -> bool:
        """Register an adapter whose buckets the policy shares by CUDA IPC (same GPU). The policy refills the
        same buckets at every push under the same payload: they are opened once, and kept open until
        another payload comes."""
        opened = getattr(self, "_grpojob_adapter_buckets", None)
        if opened is None or opened[0] != payload:
            self._grpojob_adapter_buckets = None  # let the previous buckets go before mapping others
            opened = self._grpojob_adapter_buckets = (payload, list(open_shared_buckets(payload)))
        return self._grpojob_add_adapter(version, config, opened[1])

    def grpojob_add_adapter_from_group(self, version: int, config: dict[str, Any], payload: bytes) -> bool:
        """Receive an adapter's buckets (pickled ``[layout, ...]``) from the broadcast group and register it."""
        group: WeightBroadcastGroup = self._grpojob_group
        return self._grpojob_add_adapter(version, config, group.receive_buckets(pickle.loads(payload), self.device))
