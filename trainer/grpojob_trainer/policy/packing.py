"""Packed training forward: a micro-batch's sequences end to end in one row, attention per sequence.

A right-padded micro-batch of ``B`` sequences (longest ``L``) costs ``B x L`` tokens of compute; packed,
it costs the ``N`` real tokens. `pack` lays the real tokens in one ``[1, N]`` row with ``position_ids``
restarting at 0 for each sequence (rotary positions as in the padded forward) and the sequences'
boundaries as ``cu_seqlens`` (``[S + 1]`` int32 offsets, flash-attention's convention).

Attention must then stay within each sequence. A block-diagonal mask over the whole row does that but
costs attention over all ``N x N`` pairs (measured slower than padding on the H200, docs/benchmarks.md);
`varlen_attention` instead runs causal attention per sequence: on CUDA through torch's
variable-length flash kernel (``torch.nn.attention.varlen.varlen_attn``, torch 2.10+), elsewhere (the
CPU tests, float32 on a GPU, an older torch) through SDPA on each sequence in turn, which gives the same
values. The function is registered with transformers' ``AttentionInterface`` under `VARLEN` and
selected for the duration of one forward (`attention_per_sequence`); transformers passes our
``cu_seq_lens_q``/``max_length_q`` keyword arguments down to it and builds no mask for it.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

VARLEN = "grpojob_varlen"
"""The attention implementation's name in transformers' ``AttentionInterface``."""


@dataclass(frozen=True)
class PackedRow:
    """The real tokens of a right-padded micro-batch, end to end in one row."""

    input_ids: torch.Tensor
    """``[1, N]`` long."""
    position_ids: torch.Tensor
    """``[1, N]`` long: each token's position in its own sequence."""
    cu_seqlens: torch.Tensor
    """``[B + 1]`` int32: where each sequence starts in the row, then ``N``."""
    max_length: int
    """The longest sequence's length."""
    keep: torch.Tensor
    """``[M]`` long: the row positions that predict a token of their own sequence (all but each
    sequence's last), in the order of ``grid``'s true cells."""
    targets: torch.Tensor
    """``[M]`` long: the token each of ``keep`` predicts."""
    grid: torch.Tensor
    """``[B, L - 1]`` bool: the cells of the padded target grid that hold a real target."""


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PackedRow:
    """Pack a right-padded ``[B, L]`` micro-batch (``attention_mask`` 1 on its real tokens, which start
    every row) into one row."""
    real = attention_mask.bool()
    lengths = real.sum(dim=1)
    row_index = real.flatten().cumsum(0).view_as(real) - 1  # each real token's place in the row
    grid = real[:, 1:]
    return PackedRow(
        input_ids=input_ids[real][None],
        position_ids=(real.cumsum(dim=1) - 1)[real][None],
        cu_seqlens=torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32),
        max_length=int(lengths.max()),
        keep=row_index[:, :-1][grid],
        targets=input_ids[:, 1:][grid],
        grid=grid,
    )


def forward_kwargs(row: PackedRow) -> dict[str, Any]:
    """The keyword arguments of an HF causal LM's forward over ``row`` under `attention_per_sequence`,
    logits only at ``row.keep``."""
    return {
        "input_ids": row.input_ids,
        "position_ids": row.position_ids,
        "use_cache": False,
        "cu_seq_lens_q": row.cu_seqlens,
        "cu_seq_lens_k": row.cu_seqlens,
        "max_length_q": row.max_length,
        "max_length_k": row.max_length,
        "logits_to_keep": row.keep,
    }


# --------------------------------------------------------------------------------------------------
# attention


def varlen_kernel() -> Callable[..., torch.Tensor] | None:
    """torch's ``varlen_attn`` (torch 2.10 and later), or None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def varlen_available(device: torch.device) -> bool:
    """Whether `varlen_attention` runs the variable-length flash kernel on ``device``."""
    return device.type == "cuda" and varlen_kernel() is not None


_KERNEL_PARAMETERS = frozenset(inspect.signature(varlen_kernel()).parameters) if varlen_kernel() else frozenset()
"""The names ``varlen_attn`` takes in this torch (read once, outside anything torch.compile traces)."""


def _kernel_parameters() -> frozenset[str]:
    return _KERNEL_PARAMETERS


def _flash(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_length: int, scale: float
) -> torch.Tensor:
    """Causal attention per sequence through ``varlen_attn``: ``[N, heads, D]`` in, ``[N, heads, D]`` out.

    Written against both signatures torch has shipped: 2.10's ``is_causal`` and no ``scale`` or GQA,
    2.12's ``window_size=(-1, 0)`` for causal, ``scale`` and ``enable_gqa``."""
    kernel = varlen_kernel()
    assert kernel is not None
    parameters = _kernel_parameters()
    options: dict[str, Any] = {}
    if "is_causal" in parameters:
        options["is_causal"] = True
    elif "window_size" in parameters:
        options["window_size"] = (-1, 0)
    else:
        raise RuntimeError(f"torch {torch.__version__}'s varlen_attn takes neither is_causal nor window_size")
    if "scale" in parameters:
        options["scale"] = scale
    elif not math.isclose(scale, q.shape[-1] ** -0.5, rel_tol=1e-6):
        raise ValueError(f"torch {torch.__version__}'s varlen_attn has no scale argument; the model's is {scale}")
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        if "enable_gqa" in parameters:
            options["enable_gqa"] = True
        else:  # query head h reads key/value head h // groups, as transformers' repeat_kv
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    cu_seqlens = cu_seqlens.to(device=q.device, dtype=torch.int32)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # no copy when they already are
    return kernel(q, k, v, cu_seqlens, cu_seqlens, max_length, max_length, **options)


def _per_sequence(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal attention per sequence through SDPA, one sequence at a time (the exact fallback)."""
    groups = q.shape[1] // k.shape[1]
    bounds = cu_seqlens.tolist()
    outputs = []
    for start, stop in itertools.pairwise(bounds):
        if stop == start:
            continue
        qs, ks, vs = (t[start:stop].transpose(0, 1) for t in (q, k, v))  # [heads, n, D]
        ks, vs = ks.repeat_interleave(groups, dim=0), vs.repeat_interleave(groups, dim=0)
        out = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)
        outputs.append(out.transpose(0, 1))
    return torch.cat(outputs)


def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A transformers attention function: ``[1, heads, N, D]`` query (``[1, kv_heads, N, D]`` key and
    value) of one packed row → ``[1, N, heads, D]``, causal within each sequence of ``cu_seq_lens_q``."""
    cu_seqlens, max_length = kwargs.get("cu_seq_lens_q"), kwargs.get("max_length_q")
    if cu_seqlens is None or max_length is None or query.shape[0] != 1:
        raise ValueError(
            f"{VARLEN} attention runs on one packed row with cu_seq_lens_q and max_length_q "
            "(grpojob_trainer.policy.packing.forward_kwargs)"
        )
    if dropout:
        raise ValueError(f"{VARLEN} attention has no dropout (the policy trains in eval mode)")
    if sliding_window is not None and sliding_window < max_length:
        raise ValueError(f"{VARLEN} attention has no sliding window ({sliding_window} < {max_length} tokens)")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [N, heads, D]
    dtype = torch.get_autocast_dtype(q.device.type) if torch.is_autocast_enabled(q.device.type) else q.dtype
    if varlen_available(q.device) and dtype in (torch.float16, torch.bfloat16):
        # the rotary embedding leaves q and k float32 under autocast; the kernel takes one 16-bit dtype and
        # contiguous heads: one copy each
        q, k, v = (t.to(dtype=dtype, memory_format=torch.contiguous_format) for t in (q, k, v))
        out = _flash(q, k, v, cu_seqlens, max_length, scale)
    else:
        out = _per_sequence(q, k, v, cu_seqlens, scale)
    return out[None], None


@contextlib.contextmanager
def attention_per_sequence(model: torch.nn.Module) -> Iterator[None]:
    """While active, ``model`` (an HF model built on transformers' ``AttentionInterface``) attends through
    `varlen_attention`; its own attention implementation again afterwards."""
    from transformers import AttentionInterface

    AttentionInterface.register(VARLEN, varlen_attention)
    previous = model.config._attn_implementation
    model.set_attn_implementation(VARLEN)
    if model.config._attn_implementation != VARLEN:
        model.set_attn_implementation(previous)
        raise ValueError(f"{type(model).__name__} cannot switch its attention implementation to {VARLEN}")
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


def supports_packing(model: torch.nn.Module) -> bool:
    """Whether ``model`` can run `attention_per_sequence` (transformers' attention interface)."""
    try:
        with attention_per_sequence(model):
            return True
    except (ValueError, AttributeError):
        return False
