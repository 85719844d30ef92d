"""Weight transport: how the trained policy's weights reach the generation engines after every step.

`WeightTransport` is the interface the training loop calls (`push`); each backend moves
``named_parameters()`` of the policy to a `WeightReceiver` (a generation backend exposing
``update_weights``). The policy and the generation model share one architecture, so parameter names
match. Backends: `InProcessWeightTransport` (the receiver is a Python object the pusher can call: same
process, or a wrapper around a remote call); a bucketed NCCL broadcast for GPUs comes later and reuses
`bucket_by_size`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import Protocol, runtime_checkable

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
    """``model.named_parameters()`` detached (tied parameters appear once, under their first name)."""
    for name, param in model.named_parameters():
        yield name, param.detach()


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
