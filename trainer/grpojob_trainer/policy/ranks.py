"""The policy's ranks: a process group of its own, FSDP2 sharding, and the split of a step between ranks.

The policy is ``world`` processes (one per GPU; on the CPU one per replica), rank ``r`` of a
torch.distributed process group that rendezvouses over TCP at rank 0's address. With ``world > 1`` the
model is sharded with FSDP2 (`shard_model`); with ``world == 1`` nothing is initialised and every
helper here is a no-op on one rank, so the trainer runs the same code either way.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch

DEFAULT_TIMEOUT_S = 1800.0


def rank_bounds(count: int, rank: int, world: int) -> tuple[int, int]:
    """``[start, stop)`` of rank ``rank``'s contiguous share of ``count`` items; shares differ by at most one,
    the first ``count % world`` ranks taking the larger."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of {world}")
    base, extra = divmod(count, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def micro_batches_per_rank(count: int, world: int, micro_batch_size: int) -> int:
    """Micro-batches every rank runs so that all run the same number: those of the largest share."""
    return math.ceil(math.ceil(count / world) / micro_batch_size)


def init_ranks(host: str, port: int, *, rank: int, world: int, backend: str, timeout_s: float = DEFAULT_TIMEOUT_S):
    """Join the policy's process group (this process's default group) at ``host:port`` (rank 0 listens
    there) and return its one-dimensional device mesh. ``backend``: ``nccl`` (GPUs) or ``gloo`` (CPU)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group(
        backend,
        init_method=f"tcp://{host}:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )
    return init_device_mesh("cuda" if backend == "nccl" else "cpu", (world,))


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: modules of the classes HF names in ``_no_split_modules``, else the
    children of ``model.model.layers``."""
    classes = set(getattr(model, "_no_split_modules", None) or ())
    layers = [module for module in model.modules() if type(module).__name__ in classes]
    if layers:
        return layers
    inner = getattr(model, "model", None)
    blocks = getattr(inner, "layers", None)
    if blocks is None:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__} to shard")
    return list(blocks)


def shard_model(model: torch.nn.Module, mesh: Any) -> torch.nn.Module:
    """Shard ``model`` in place with FSDP2 over ``mesh``: each decoder layer, then the root (embeddings,
    final norm, head). Gradients are reduced as the SUM over ranks: each rank's loss is already
    normalised by the whole step's count, so the sum is the step's gradient."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no pre-multiplied sum
    return model


def distributed() -> bool:
    """Whether this process is one rank of several."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank among the policy's (0 when it is the only one)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def all_reduce(values: list[float], op: str) -> list[float]:
    """``values`` combined element-wise over all ranks (``sum`` or ``max``); unchanged on one rank."""
    if not distributed() or not values:
        return list(values)
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        tensor = tensor.cuda()
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return tensor.cpu().tolist()


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a collective: every rank must call it), or the tensor itself."""
    gather = getattr(tensor, "full_tensor", None)
    return gather() if callable(gather) else tensor


def trainable_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``model.named_parameters()`` detached (tied parameters appear once, under their first name).

    A parameter sharded by FSDP2 (a DTensor) is gathered into its full tensor.
    """
    for name, param in model.named_parameters():
        yield name, full_tensor(param.detach())
