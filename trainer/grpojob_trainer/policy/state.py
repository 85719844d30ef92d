"""The policy's full state, gathered out of its ranks into host memory and put back: the model's tensors (tied
weights once), a LoRA policy's adapter, the optimizer's state numbered as ``Optimizer.state_dict`` numbers it, and
the random-number generators' states. What a checkpoint (`grpojob_trainer.policy.checkpoint`) and an export hold.

Gathering is a collective on a sharded model (FSDP2, ``torch.distributed.checkpoint.state_dict``): every rank calls
it, rank 0 gets the full state and the others empty dicts.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpojob_trainer.policy.lora import adapter_weights
from grpojob_trainer.weight_sync.buckets import tensor_bytes

KEPT_HOST_BYTES = 4 << 30
"""`HostCopies` keeps pinned buffers for a state on the GPU of at most this many bytes (4 GiB: a 7B model's LoRA
adapter of rank 64 with its AdamW moments is about 1.9 GB)."""
HOST_COPY_SHARE = 0.8
"""`HostCopies.fits`: the share of the host memory still available that a checkpoint's copies may take (the rest
for what the pod's other processes allocate meanwhile)."""


def rng_state() -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's global random-number generators."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    random.setstate(state["python"])
    saved = state["numpy"]
    np.random.set_state(
        (
            saved["kind"],
            saved["keys"].numpy().astype(np.uint32),
            saved["pos"],
            saved["has_gauss"],
            saved["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def tied_names(model: torch.nn.Module) -> list[list[str]]:
    """Names of parameters that are one tensor (tied weights), in groups of two or more, first name first."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def optimizer_param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of ``optimizer``'s parameters in the order its state dict numbers them."""
    names = {id(param): name for name, param in model.named_parameters()}
    return [names[id(param)] for group in optimizer.param_groups for param in group["params"]]


def optimizer_state_by_index(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter names (``get_optimizer_state_dict``'s) keyed by number
    instead, as ``Optimizer.state_dict`` numbers them: in the order of the parameter groups."""
    index: dict[str, int] = {}
    groups = []
    for group in state["param_groups"]:
        groups.append({**group, "params": [index.setdefault(name, len(index)) for name in group["params"]]})
    return {"state": {index[name]: value for name, value in state["state"].items()}, "param_groups": groups}


def optimizer_state_by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The inverse of `optimizer_state_by_index`, for parameters numbered as ``names`` lists them."""
    return {
        "state": {names[index]: value for index, value in state["state"].items()},
        "param_groups": [{**group, "params": [names[i] for i in group["params"]]} for group in state["param_groups"]],
    }


def gather_model_state(model: torch.nn.Module, *, offload: bool = True) -> dict[str, torch.Tensor]:
    """The full (unsharded, on the CPU) model state, tied weights once. A collective on a sharded model:
    every rank calls it, rank 0 gets the state and the others an empty dict. Not ``offload`` (one rank only):
    the model's own tensors, where they are."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    model_state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=offload))
    if not model_state:
        return {}
    for names in tied_names(model):
        for alias in names[1:]:
            model_state.pop(alias, None)
    return {k: v.contiguous() for k, v in model_state.items()}


def sharded() -> bool:
    """Whether the policy is several ranks (a process group initialised): its state is gathered, not read."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def gather_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, offload: bool = True
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """`gather_model_state`, and the optimizer state, numbered as ``Optimizer.state_dict`` numbers it.
    A collective on a sharded model: rank 0 gets the states and the others empty dicts. Not ``offload`` (one
    rank only): the policy's own tensors, where they are, for the caller to copy (`HostCopies`)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    model_state = gather_model_state(model, offload=offload)
    options = StateDictOptions(full_state_dict=True, cpu_offload=offload)
    optimizer_state = get_optimizer_state_dict(model, optimizer, options=options)
    if not model_state:
        return {}, {}
    return model_state, optimizer_state_by_index(optimizer_state)


def gather_adapter_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, offload: bool = True
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A LoRA policy's `gather_state`: the adapter's tensors under their file names and the optimizer's
    state. A collective on a sharded model: rank 0 gets the states and the others empty dicts. Not ``offload``
    (one rank only): the policy's own tensors, where they are."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from grpojob_trainer.policy.ranks import rank

    adapter = {name: tensor.detach().contiguous() for name, tensor in adapter_weights(model)}
    if offload:
        adapter = {name: tensor.cpu() for name, tensor in adapter.items()}
    options = StateDictOptions(full_state_dict=True, cpu_offload=offload)
    optimizer_state = get_optimizer_state_dict(model, optimizer, options=options)
    if rank() != 0:
        return {}, {}
    return adapter, optimizer_state_by_index(optimizer_state)


def restore_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any] | None,
    *,
    strict: bool = True,
) -> None:
    """Load full states (as `gather_state` returns them, or as read from a checkpoint) into a model and
    optimizer, sharded or not (every rank of a sharded model calls it with the full states). Not
    ``strict``: ``model_state`` may hold only some of the model's tensors (a LoRA policy's adapter)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    model_state = dict(model_state)
    for names in tied_names(model):
        present = next((name for name in names if name in model_state), None)
        if present is not None:
            model_state |= {name: model_state[present] for name in names}
    options = StateDictOptions(full_state_dict=True, strict=strict)
    set_model_state_dict(model, model_state, options=options)
    if optimizer is not None and optimizer_state is not None:
        named = optimizer_state_by_name(optimizer_state, optimizer_param_names(model, optimizer))
        set_optimizer_state_dict(model, optimizer, named, options=options)


def storages(tensors: list[torch.Tensor]) -> set[int]:
    """Where the host-memory storages of ``tensors`` (a sharded tensor's local shard) begin."""
    from torch.distributed.tensor import DTensor

    found = set()
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        if local.device.type == "cpu":
            found.add(local.untyped_storage().data_ptr())
    return found


def available_host_bytes() -> int | None:
    """Host memory this process may still allocate: the least of what its memory cgroup (the container's limit
    less its working set, cgroup v2 or v1) and the machine (``MemAvailable``) have left; None where neither says.
    The working set, as the kubelet counts it, leaves out the file cache the kernel can reclaim (a checkpoint
    just written, the model's files just read)."""
    found = []
    for root, limit_name, usage_name, cache_name in (
        ("/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"),
        ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
    ):
        try:
            limit, usage = (Path(root, name).read_text().strip() for name in (limit_name, usage_name))
            if limit == "max" or int(limit) >= 1 << 60:  # cgroup v1 writes "no limit" as about 2^63
                continue
            stat = dict(line.split() for line in Path(root, "memory.stat").read_text().splitlines())
            found.append(int(limit) - int(usage) + int(stat.get(cache_name, 0)))
            break
        except (OSError, ValueError):
            continue
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return max(0, min(found)) if found else None


class HostCopies:
    """Copies of a policy's state in host memory the copies own, for a checkpoint to write while the policy trains
    on (`grpojob_trainer.policy.checkpoint.snapshot_checkpoint`).

    A tensor on a GPU is copied into a pinned host buffer, all copies queued at once and waited for together
    (`copy`), so that a checkpoint stalls its step for the transfer alone: new pageable memory tensor by tensor
    ran at about 1.2 GB/s on an H100 (a LoRA adapter's 0.9 GB of state stalled each save 0.74 s). The buffers are
    kept for the next checkpoint while the state's GPU tensors take at most ``keep_bytes`` (pinned memory is the
    host's for good; a full fine-tune's state, several times that, is copied into new memory each time): a
    checkpoint's copies are therefore valid until the next `copy`, and whoever writes them must finish before
    it (`grpojob_trainer.policy.checkpoint_writer` writes one at a time). A tensor on the CPU that shares memory
    with the policy (``live``: `storages`) is cloned; one that does not (gathered out of shards) is taken as is.
    """

    def __init__(
        self, keep_bytes: int = KEPT_HOST_BYTES, available: Callable[[], int | None] = available_host_bytes
    ) -> None:
        self.keep_bytes = keep_bytes
        self.available = available
        """Host memory still free to allocate (`available_host_bytes`), asked by `fits`."""
        self._buffers: dict[str, torch.Tensor] = {}

    def fits(self, states: dict[str, Any], live: set[int]) -> bool:
        """Whether copying ``states`` (as `copy` would) takes at most `HOST_COPY_SHARE` of the host memory still
        available, counting the buffers kept from the last copy as free. A state that does not fit (a full
        fine-tune's in a pod sized for the model, not for a second copy of its optimizer) is written from the
        policy's own tensors instead (`grpojob_trainer.policy.checkpoint.snapshot_checkpoint`)."""
        tensors = _tensors(states)
        on_device = [t for t in tensors if t.device.type != "cpu"]
        needed = _bytes(on_device) + _bytes(
            [t for t in tensors if t.device.type == "cpu" and t.untyped_storage().data_ptr() in live]
        )
        if self._reuses(on_device):
            needed -= _bytes(list(self._buffers.values()))
        available = self.available()
        return needed <= 0 or available is None or needed <= HOST_COPY_SHARE * available

    def release(self) -> None:
        """Drop the buffers kept from the last copy (PyTorch's pinned-memory cache may keep their blocks for the
        next pinned allocation)."""
        self._buffers.clear()

    def copy(self, states: dict[str, Any], live: set[int]) -> dict[str, Any]:
        """``states`` (named trees of dicts, lists and tuples of tensors) copied into host memory of their own."""
        on_device = [t for t in _tensors(states) if t.device.type != "cpu"]
        keep = self._reuses(on_device)
        if not keep:
            self._buffers.clear()
        copied = {name: self._copy(state, name, live, keep) for name, state in states.items()}
        if on_device and keep:
            torch.cuda.synchronize()  # the copies were queued without waiting
        return copied

    def _reuses(self, on_device: list[torch.Tensor]) -> bool:
        """Whether `copy` keeps pinned buffers for these GPU tensors (and reuses those kept from the last copy)."""
        return _bytes(on_device) <= self.keep_bytes and all(t.device.type == "cuda" for t in on_device)

    def _copy(self, state: Any, path: str, live: set[int], keep: bool) -> Any:
        if isinstance(state, torch.Tensor):
            if state.device.type == "cpu":
                return state.clone() if state.untyped_storage().data_ptr() in live else state
            if not keep:
                return state.cpu()
            buffer = self._buffers.get(path)
            if buffer is None or buffer.shape != state.shape or buffer.dtype != state.dtype:
                buffer = self._buffers[path] = torch.empty(state.shape, dtype=state.dtype, pin_memory=True)
            return buffer.copy_(state, non_blocking=True)
        if isinstance(state, dict):
            return {key: self._copy(value, f"{path}/{key}", live, keep) for key, value in state.items()}
        if isinstance(state, list | tuple):
            return type(state)(self._copy(value, f"{path}/{i}", live, keep) for i, value in enumerate(state))
        return state


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(tensor_bytes(t) for t in tensors)


def _tensors(state: Any) -> list[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for value in state.values() for t in _tensors(value)]
    if isinstance(state, list | tuple):
        return [t for value in state for t in _tensors(value)]
    return []
