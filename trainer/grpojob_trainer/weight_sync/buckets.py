"""Weight transport: the pieces that move the trained policy's weights to the generation engines.

The weights travel as *buckets*: the parameters, cast to the engine's dtype, packed back to back into
flat tensors of at most ``bucket_bytes`` each (`plan_buckets` decides the layout once, `pack_bucket`
fills a bucket, `unpack_bucket` gives the receiver views of it by name). A bucket then reaches the
engine either as a CUDA IPC handle (`share_cuda_tensor` / `open_shared_tensor`: policy and engine on the
same GPU, no copy through the host) or by a broadcast in a `WeightBroadcastGroup` (NCCL between GPUs;
gloo on the CPU, which is how the protocol is tested without GPUs). Which path a run takes is
`grpojob_trainer.weight_sync.paths`'s choice.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

NamedTensor = tuple[str, torch.Tensor]


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


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
    fill_bucket(layout, tensors, flat)
    return flat


def fill_bucket(layout: BucketLayout, tensors: Mapping[str, torch.Tensor], flat: torch.Tensor) -> None:
    """Write ``layout``'s tensors into ``flat``, cast to its dtype, by one batched copy rather than a copy
    (and a kernel launch) per tensor: a 7B model's rank-64 adapter is 392 matrices."""
    views = [view for _, view in unpack_bucket(layout, flat)]
    torch._foreach_copy_(views, [tensors[slot.name] for slot in layout.slots])


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


def share_buckets(
    layouts: Iterable[BucketLayout], tensors: Mapping[str, torch.Tensor], device: torch.device
) -> tuple[bytes, list[torch.Tensor]]:
    """Pack ``tensors`` into buckets on GPU ``device`` and share them: the payload for
    `open_shared_buckets` (pickled ``(gpu_uuid, [(layout, handle), ...])``) and the buckets, which the
    caller keeps alive until every receiver has loaded them."""
    layouts = list(layouts)
    buckets = [pack_bucket(layout, tensors, device) for layout in layouts]
    torch.cuda.synchronize(device)
    shared = [(layout, share_cuda_tensor(bucket)) for layout, bucket in zip(layouts, buckets, strict=True)]
    return pickle.dumps((device_uuid(device), shared)), buckets


def open_shared_buckets(payload: bytes) -> Iterator[NamedTensor]:
    """The receiver's side of `share_buckets`: views by name of each bucket, opened in place on this
    process's index of the sender's GPU."""
    uuid, shared = pickle.loads(payload)
    index = local_device_index(uuid)
    for layout, handle in shared:
        yield from unpack_bucket(layout, open_shared_tensor(handle, index))


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
