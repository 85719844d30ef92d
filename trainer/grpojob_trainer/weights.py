"""Weight transport: how the trained policy's weights reach the generation engines after every step.

`WeightTransport` is the interface the training loop calls (`push`); each backend moves
``named_parameters()`` of the policy to a `WeightReceiver` (a generation backend exposing
``update_weights``). The policy and the generation model share one architecture, so parameter names
match. Backends: `InProcessWeightTransport` (the receiver is a Python object the pusher can call: same
process, or a wrapper around a remote call).

For GPUs the weights travel as *buckets*: the parameters, cast to the engine's dtype, packed back to
back into flat tensors of at most ``bucket_bytes`` each (`plan_buckets` decides the layout once,
`pack_bucket` fills a bucket, `unpack_bucket` gives the receiver views of it by name). A bucket then
reaches the engine either as a CUDA IPC handle (`share_cuda_tensor` / `open_shared_tensor`: policy and
engine on the same GPU, no copy through the host) or by a broadcast in a `WeightBroadcastGroup` (NCCL
between GPUs; gloo on the CPU, which is how the protocol is tested without GPUs).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

import torch

NamedTensor = tuple[str, torch.Tensor]


@runtime_checkable
class WeightReceiver(Protocol):
    """A generation backend that accepts new weights.

    ``update_weights`` copies each named tensor into the parameter of the same name (converting dtype
    and device as needed); a call may carry a subset of the parameters (one bucket). The tensors may
    be views of the trainer's live parameters: copy them, never keep references. The return value (the
    transformers backend returns its new weights version) is ignored.
    """

    def update_weights(self, named_tensors: Iterable[NamedTensor]) -> object: ...


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def bucket_by_size(named_tensors: Iterable[NamedTensor], bucket_bytes: int) -> Iterator[list[NamedTensor]]:
    """Group tensors, in order, into buckets of at most ``bucket_bytes`` bytes each.

    A tensor larger than ``bucket_bytes`` gets a bucket of its own. Lazy: a bucket is yielded as soon
    as the next tensor would overflow it, so at most one bucket is held at a time.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    bucket: list[NamedTensor] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor_bytes(tensor)
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def trainable_weights(model: torch.nn.Module) -> Iterator[NamedTensor]:
    """``model.named_parameters()`` detached (tied parameters appear once, under their first name).

    A parameter sharded by FSDP2 (a DTensor) is gathered into its full tensor.
    """
    for name, param in model.named_parameters():
        tensor = param.detach()
        full_tensor = getattr(tensor, "full_tensor", None)
        yield name, full_tensor() if callable(full_tensor) else tensor


@dataclass(frozen=True)
class TensorSlot:
    """Where one named tensor lies in a flat bucket: ``flat[offset : offset + numel].view(shape)``."""

    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int


@dataclass(frozen=True)
class BucketLayout:
    """The tensors of one bucket, packed back to back in one flat tensor of ``dtype``."""

    dtype: str
    """A torch dtype's name, e.g. ``bfloat16``."""
    slots: tuple[TensorSlot, ...]

    @property
    def numel(self) -> int:
        last = self.slots[-1]
        return last.offset + last.numel

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


def plan_buckets(
    shapes: Iterable[tuple[str, tuple[int, ...]]], *, bucket_bytes: int, dtype: torch.dtype
) -> list[BucketLayout]:
    """Lay named tensors out, in order, in buckets of at most ``bucket_bytes`` bytes of ``dtype``.

    A tensor larger than ``bucket_bytes`` gets a bucket of its own. Sender and receivers compute or
    exchange the same layout, so a broadcast needs no per-bucket metadata.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    element = torch.empty((), dtype=dtype).element_size()
    dtype_name = str(dtype).removeprefix("torch.")
    layouts: list[BucketLayout] = []
    slots: list[TensorSlot] = []
    used = 0
    for name, shape in shapes:
        numel = 1
        for size in shape:
            numel *= size
        if slots and (used + numel) * element > bucket_bytes:
            layouts.append(BucketLayout(dtype_name, tuple(slots)))
            slots, used = [], 0
        slots.append(TensorSlot(name, tuple(shape), used, numel))
        used += numel
    if slots:
        layouts.append(BucketLayout(dtype_name, tuple(slots)))
    return layouts


def pack_bucket(layout: BucketLayout, tensors: Mapping[str, torch.Tensor], device: torch.device | str) -> torch.Tensor:
    """A new flat tensor on ``device`` holding ``layout``'s tensors, cast to its dtype."""
    flat = torch.empty(layout.numel, dtype=layout.torch_dtype, device=device)
    for slot in layout.slots:
        flat[slot.offset : slot.offset + slot.numel].view(slot.shape).copy_(tensors[slot.name])
    return flat


def unpack_bucket(layout: BucketLayout, flat: torch.Tensor) -> list[NamedTensor]:
    """Views of ``flat`` by name (no copy): the receiver's side of `pack_bucket`."""
    if flat.numel() != layout.numel:
        raise ValueError(f"a bucket of {flat.numel()} elements received, the layout has {layout.numel}")
    return [(s.name, flat[s.offset : s.offset + s.numel].view(s.shape)) for s in layout.slots]


# --------------------------------------------------------------------------------------------------
# CUDA IPC: the engine opens the policy's bucket in place (same GPU, another process)


def device_uuid(device: torch.device | int) -> str:
    """The GPU's UUID: the same physical GPU has the same UUID in every process, whatever its index."""
    return str(torch.cuda.get_device_properties(device).uuid)


def share_cuda_tensor(tensor: torch.Tensor) -> tuple[Any, tuple[Any, ...]]:
    """A picklable handle another process on the same GPU opens with `open_shared_tensor`.

    The sharing process must keep ``tensor`` alive, and have finished writing it
    (``torch.cuda.synchronize()``), until the receivers are done with it.
    """
    from torch.multiprocessing.reductions import reduce_tensor

    return reduce_tensor(tensor)


# In torch's CUDA rebuild arguments (torch.multiprocessing.reductions.reduce_tensor), the device index.
_REBUILD_DEVICE_ARG = 6


def open_shared_tensor(handle: tuple[Any, tuple[Any, ...]], device_index: int) -> torch.Tensor:
    """The tensor behind ``handle``, mapped into this process on its local GPU ``device_index``.

    Processes number their visible GPUs differently; the caller finds the index of the sender's GPU
    (by `device_uuid`) and passes it here.
    """
    rebuild, args = handle
    args = list(args)
    args[_REBUILD_DEVICE_ARG] = device_index
    return rebuild(*args)


def local_device_index(uuid: str) -> int:
    """This process's index of the GPU with ``uuid``; ValueError if it cannot see that GPU."""
    for index in range(torch.cuda.device_count()):
        if device_uuid(index) == uuid:
            return index
    raise ValueError(f"GPU {uuid} is not visible to this process")


# --------------------------------------------------------------------------------------------------
# Broadcast: policy (rank 0) to engines (ranks 1..n), bucket by bucket


class WeightBroadcastGroup:
    """A process group of its own (not torch.distributed's default group, which vLLM uses) between the
    policy, rank 0, and the engines, ranks 1 … world_size - 1, rendezvousing on a TCP store that rank
    0 hosts at ``host:port``. ``backend`` is ``nccl`` for GPU tensors or ``gloo`` for CPU tensors.
    """

    def __init__(
        self, host: str, port: int, *, world_size: int, rank: int, backend: str = "nccl", timeout_s: float = 300.0
    ) -> None:
        import torch.distributed as dist

        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside a group of {world_size}")
        timeout = timedelta(seconds=timeout_s)
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
        if backend == "nccl":
            self.group: Any = dist.ProcessGroupNCCL(self.store, rank, world_size, timeout)
        elif backend == "gloo":
            self.group = dist.ProcessGroupGloo(self.store, rank, world_size, timeout)
        else:
            raise ValueError(f"backend must be nccl or gloo, got {backend!r}")

    def broadcast(self, tensor: torch.Tensor, root: int = 0) -> None:
        """Broadcast ``tensor`` in place from ``root`` to every rank; returns when it arrived here."""
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank = root
        options.rootTensor = 0
        self.group.broadcast([tensor], options).wait()

    def send_buckets(self, layouts: Iterable[BucketLayout], tensors: Mapping[str, torch.Tensor], device: Any) -> int:
        """Rank 0: pack and broadcast every bucket, in order; returns the bytes sent."""
        sent = 0
        for layout in layouts:
            flat = pack_bucket(layout, tensors, device)
            self.broadcast(flat)
            sent += tensor_bytes(flat)
        return sent

    def receive_buckets(self, layouts: Iterable[BucketLayout], device: Any) -> Iterator[NamedTensor]:
        """Ranks 1…: receive the buckets in order, yielding views of each by name as it arrives."""
        for layout in layouts:
            flat = torch.empty(layout.numel, dtype=layout.torch_dtype, device=device)
            self.broadcast(flat)
            yield from unpack_bucket(layout, flat)


@torch.no_grad()
def copy_into(model: torch.nn.Module, named_tensors: Iterable[NamedTensor]) -> int:
    """Copy named tensors into ``model``'s parameters of the same names (a receiver's `update_weights`).

    Converts dtype and device. Raises KeyError for a name the model does not have and ValueError for a
    shape mismatch. Returns the number of tensors copied.
    """
    params = dict(model.named_parameters())
    copied = 0
    for name, tensor in named_tensors:
        if name not in params:
            raise KeyError(f"the receiving model has no parameter {name!r}")
        target = params[name]
        if target.shape != tensor.shape:
            raise ValueError(f"parameter {name!r}: shape {tuple(tensor.shape)} sent, {tuple(target.shape)} expected")
        target.copy_(tensor)
        copied += 1
    return copied


class WeightTransport(ABC):
    """Moves the policy's weights to the generation engines; `push` returns transfer metrics."""

    @abstractmethod
    def push(self, model: torch.nn.Module) -> dict[str, float]:
        """Send ``model``'s parameters; when it returns, the receivers generate with them."""


class InProcessWeightTransport(WeightTransport):
    """Calls ``receiver.update_weights`` directly with the policy's parameters.

    With ``bucket_bytes`` None (the default) the receiver gets all parameters in one call; otherwise one
    call per bucket of at most ``bucket_bytes`` bytes (a tensor larger than that alone).
    """

    def __init__(
        self, receivers: WeightReceiver | Iterable[WeightReceiver], *, bucket_bytes: int | None = None
    ) -> None:
        self.receivers = [receivers] if isinstance(receivers, WeightReceiver) else list(receivers)
        if not self.receivers:
            raise ValueError("InProcessWeightTransport needs at least one receiver")
        self.bucket_bytes = bucket_bytes

    def push(self, model: torch.nn.Module) -> dict[str, float]:
        started = time.perf_counter()
        weights = list(trainable_weights(model))
        buckets = [weights] if self.bucket_bytes is None else list(bucket_by_size(weights, self.bucket_bytes))
        with torch.no_grad():
            for receiver in self.receivers:
                for bucket in buckets:
                    receiver.update_weights(bucket)
        return {
            "weight_sync/bytes": float(sum(tensor_bytes(t) for _, t in weights)),
            "weight_sync/tensors": float(len(weights)),
            "weight_sync/buckets": float(len(buckets)),
            "weight_sync/seconds": time.perf_counter() - started,
        }
