"""Token log-probabilities of a causal LM without the vocabulary-wide float32 logits tensor.

``log p(target) = logit[target] / T - logsumexp(logits / T)`` needs every logit of a position, but never
all positions' logits at once: `linear_logprobs` multiplies the hidden states by the output embedding a
chunk of positions at a time and keeps one float32 number per position (and the log-sum-exp for the
backward pass). Memory is ``chunk x vocabulary`` float32 (`CHUNK_BYTES`) instead of ``tokens x
vocabulary``: 2.9 GB for a micro-batch of 4,800 tokens over a 151,936-token vocabulary, with as much
again for the softmax and the gradient, is what a materialised head costs. For the backward pass the
softmax of every position is kept when all of them fit in `KEPT_PROBABILITIES_BYTES` (small
micro-batches: no recomputation); above that each chunk's logits are computed again in the backward
pass, one more product with the output embedding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

CHUNK_BYTES = 1 << 28
"""The float32 logits of one chunk of positions take at most this much memory (256 MiB)."""

KEPT_PROBABILITIES_BYTES = 1 << 30
"""Up to this size (1 GiB) the float32 softmax of every position is kept for the backward pass; above it,
each chunk's logits are recomputed there."""

PLAIN_HEAD_MODEL_TYPES = frozenset(
    {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "olmo2", "smollm3"}
)
"""Model types whose logits are the output embedding's product with the last hidden states and nothing
more (others scale or soft-cap them: Gemma 2 and 3, Cohere, Granite)."""


def chunk_positions(vocabulary: int) -> int:
    """How many positions' float32 logits fit in `CHUNK_BYTES`."""
    return max(1, CHUNK_BYTES // (4 * vocabulary))


class _LinearLogProbs(torch.autograd.Function):
    """``log_softmax(hidden @ weight.T / temperature)[target]`` per position, chunked; the softmax kept
    for the backward pass (``keep``) or recomputed there chunk by chunk."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        temperature: float,
        compute_dtype: torch.dtype,
        keep: bool,
    ) -> torch.Tensor:
        chunk = chunk_positions(weight.shape[0])
        h, w = hidden.to(compute_dtype), weight.to(compute_dtype)
        picked = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
        lse = torch.empty_like(picked)
        kept = []
        for start in range(0, h.shape[0], chunk):
            stop = start + chunk
            logits = (h[start:stop] @ w.T).float() / temperature
            lse[start:stop] = torch.logsumexp(logits, dim=-1)
            picked[start:stop] = logits.gather(-1, targets[start:stop, None]).squeeze(-1)
            if keep:
                kept.append(logits.sub_(lse[start:stop, None]).exp_())
        probabilities = torch.cat(kept) if kept else None
        ctx.save_for_backward(h, w, targets, lse, probabilities)
        ctx.temperature = temperature
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return picked - lse

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        h, w, targets, lse, probabilities = ctx.saved_tensors
        hidden_dtype, weight_dtype = ctx.dtypes
        chunk = chunk_positions(w.shape[0])
        grad_hidden = torch.empty(h.shape, dtype=hidden_dtype, device=h.device)
        grad_weight = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
        rows = torch.arange(min(chunk, h.shape[0]), device=h.device)
        for start in range(0, h.shape[0], chunk):
            stop = start + chunk
            g = grad_out[start:stop].float()
            if probabilities is not None:
                softmax = probabilities[start:stop]
            else:
                softmax = ((h[start:stop] @ w.T).float() / ctx.temperature).sub_(lse[start:stop, None]).exp_()
            # d(picked - lse)/d logits = onehot(target) - softmax, then / temperature
            grad_logits = softmax * -g[:, None]
            grad_logits[rows[: g.shape[0]], targets[start:stop]] += g
            grad_logits = grad_logits.div_(ctx.temperature).to(h.dtype)
            grad_hidden[start:stop] = grad_logits @ w
            grad_weight += (grad_logits.T @ h[start:stop]).float()
        return grad_hidden, grad_weight.to(weight_dtype), None, None, None, None


def linear_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float
) -> torch.Tensor:
    """``[..., H]`` hidden states, the ``[V, H]`` output embedding and ``[...]`` target ids → ``[...]`` float32
    ``log softmax(hidden @ weight.T / temperature)[target]``. Under autocast the products run in the
    autocast dtype (as the model's own head would), the softmax in float32."""
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    positions = targets.numel()
    training = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    keep = training and positions * weight.shape[0] * 4 <= KEPT_PROBABILITIES_BYTES
    with torch.autocast(device, enabled=False):
        flat = _LinearLogProbs.apply(
            hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1), temperature, dtype, keep
        )
    return flat.reshape(targets.shape)


def plain_head(model: torch.nn.Module) -> bool:
    """Whether ``model``'s logits are its output embedding times its last hidden states, nothing more
    (no bias, soft-capping or scale), so that `logprob_head` can stand in for them."""
    head = model.get_output_embeddings()
    plain_type = getattr(model.config, "model_type", None) in PLAIN_HEAD_MODEL_TYPES
    return plain_type and isinstance(head, torch.nn.Linear) and head.bias is None


@contextlib.contextmanager
def logprob_head(model: torch.nn.Module, targets: torch.Tensor, temperature: float) -> Iterator[None]:
    """While active, ``model(...).logits`` are the float32 log-probabilities of ``targets`` (shaped as the
    input ids) instead of the logits: the output embedding's forward becomes `linear_logprobs`. Its
    weight is read inside the model's forward, where FSDP2 has gathered it."""
    if not plain_head(model):
        raise ValueError(f"{type(model).__name__}'s head is not a plain linear map of its last hidden states")
    head = model.get_output_embeddings()
    head.forward = lambda hidden: linear_logprobs(hidden, head.weight, targets, temperature)
    try:
        yield
    finally:
        del head.forward  # the class's forward again
