"""Token log-probabilities of a causal LM without the vocabulary-wide logits tensor.

``log p(target) = logit[target] / T - logsumexp(logits / T)`` needs every logit of a position, but never
all positions' logits at once: `linear_logprobs` multiplies the hidden states by the output embedding a
chunk of positions at a time, keeps one float32 number per position (and the log-sum-exp for the
backward pass) and recomputes each chunk's logits in the backward pass. Memory is ``chunk x vocabulary``
instead of ``tokens x vocabulary`` float32 (about 2.4 GB for 4,096 tokens of a 151,936-token
vocabulary); the recomputation costs time, so `grpojob_trainer.policy.forward` uses it only for micro-batches
whose logits would be large.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

CHUNK_BYTES = 1 << 28
"""The float32 logits of one chunk of positions take at most this much memory (256 MiB)."""


def chunk_positions(vocabulary: int) -> int:
    """How many positions' float32 logits fit in `CHUNK_BYTES`."""
    return max(1, CHUNK_BYTES // (4 * vocabulary))


class _LinearLogProbs(torch.autograd.Function):
    """``log_softmax(hidden @ weight.T / temperature)[target]`` per position, chunked, logits recomputed
    in the backward pass."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        temperature: float,
        compute_dtype: torch.dtype,
    ) -> torch.Tensor:
        chunk = chunk_positions(weight.shape[0])
        h, w = hidden.to(compute_dtype), weight.to(compute_dtype)
        picked = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
        lse = torch.empty_like(picked)
        for start in range(0, h.shape[0], chunk):
            stop = start + chunk
            logits = (h[start:stop] @ w.T).float() / temperature
            lse[start:stop] = torch.logsumexp(logits, dim=-1)
            picked[start:stop] = logits.gather(-1, targets[start:stop, None]).squeeze(-1)
        ctx.save_for_backward(h, w, targets, lse)
        ctx.temperature = temperature
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return picked - lse

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        h, w, targets, lse = ctx.saved_tensors
        hidden_dtype, weight_dtype = ctx.dtypes
        chunk = chunk_positions(w.shape[0])
        grad_hidden = torch.empty(h.shape, dtype=hidden_dtype, device=h.device)
        grad_weight = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
        rows = torch.arange(min(chunk, h.shape[0]), device=h.device)
        for start in range(0, h.shape[0], chunk):
            stop = start + chunk
            g = grad_out[start:stop].float()
            logits = (h[start:stop] @ w.T).float() / ctx.temperature
            # d(picked - lse)/d logits = onehot(target) - softmax, then / temperature
            grad_logits = torch.exp(logits - lse[start:stop, None]).mul_(-g[:, None])
            grad_logits[rows[: g.shape[0]], targets[start:stop]] += g
            grad_logits = grad_logits.div_(ctx.temperature).to(h.dtype)
            grad_hidden[start:stop] = grad_logits @ w
            grad_weight += (grad_logits.T @ h[start:stop]).float()
        return grad_hidden, grad_weight.to(weight_dtype), None, None, None


def linear_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float
) -> torch.Tensor:
    """``[..., H]`` hidden states, the ``[V, H]`` output embedding and ``[...]`` target ids → ``[...]`` float32
    ``log softmax(hidden @ weight.T / temperature)[target]``. Under autocast the products run in the
    autocast dtype (as the model's own head would), the softmax in float32."""
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    with torch.autocast(device, enabled=False):
        flat = _LinearLogProbs.apply(
            hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1), temperature, dtype
        )
    return flat.reshape(targets.shape)


@contextlib.contextmanager
def logprob_head(model: torch.nn.Module, targets: torch.Tensor, temperature: float) -> Iterator[None]:
    """While active, ``model(...).logits`` are the float32 log-probabilities of ``targets`` (shaped as the
    input ids) instead of the logits: the output embedding's forward becomes `linear_logprobs`. Its
    weight is read inside the model's forward, where FSDP2 has gathered it."""
    head = model.get_output_embeddings()
    if getattr(model.config, "final_logit_softcapping", None) or getattr(head, "bias", None) is not None:
        raise ValueError(f"{type(model).__name__}'s head is not a plain linear map of its last hidden states")
    head.forward = lambda hidden: linear_logprobs(hidden, head.weight, targets, temperature)
    try:
        yield
    finally:
        del head.forward  # the class's forward again
