"""The chunked log-probability head gives the full logits' log-probabilities and gradients.

The reference is one right-padded forward with the whole ``[B, L, V]`` logits in float32 and a
log-softmax (what `token_logprobs` does below `FULL_LOGITS_BYTES`)."""

from __future__ import annotations

import pytest
import torch

from grpojob_trainer.algorithm.samples import TrainingSample
from grpojob_trainer.policy import forward, logprobs
from grpojob_trainer.policy.forward import TokenBatch, build_batch, token_logprobs

from .models import tiny_causal_lm

TEMPERATURE = 0.7


def samples() -> list[TrainingSample]:
    lengths = [(3, 4), (2, 1), (5, 7), (1, 2)]
    generator = torch.Generator().manual_seed(0)
    out = []
    for group, (prompt, completion) in enumerate(lengths):
        ids = torch.randint(1, 64, (prompt + completion,), generator=generator).tolist()
        out.append(
            TrainingSample(
                token_ids=tuple(ids),
                generated_mask=(False,) * prompt + (True,) * completion,
                generation_log_probs=(0.0,) * prompt + (-1.0,) * completion,
                reward=float(group),
                group_index=group,
            )
        )
    return out


def full_logits_logprobs(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
    return torch.log_softmax(logits / TEMPERATURE, dim=-1).gather(-1, batch.target_ids[..., None]).squeeze(-1)


def loss_and_gradients(model: torch.nn.Module, compute) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    batch = build_batch(samples(), pad_token_id=0)
    model.zero_grad(set_to_none=True)
    values = compute(model, batch)
    weights = torch.linspace(-1.0, 1.0, batch.loss_mask.numel()).view_as(batch.loss_mask)
    (values * weights)[batch.loss_mask].sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return torch.where(batch.loss_mask, values, 0.0).detach(), grads


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("chunk_positions", [None, 3], ids=["one-chunk", "chunks-of-3"])
def test_the_chunked_head_gives_the_full_logits_values_and_gradients(tied, chunk_positions, monkeypatch):
    monkeypatch.setattr(forward, "FULL_LOGITS_BYTES", 0)  # every micro-batch through the chunked head
    if chunk_positions is not None:  # the tiny vocabulary fits one chunk: force several
        monkeypatch.setattr(logprobs, "CHUNK_BYTES", 4 * 64 * chunk_positions)
    expected, expected_grads = loss_and_gradients(tiny_causal_lm(seed=2, tied=tied), full_logits_logprobs)
    chunked, chunked_grads = loss_and_gradients(
        tiny_causal_lm(seed=2, tied=tied), lambda m, b: token_logprobs(m, b, TEMPERATURE)
    )
    torch.testing.assert_close(chunked, expected, atol=1e-5, rtol=1e-5)
    assert chunked_grads.keys() == expected_grads.keys()
    for name, grad in expected_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_under_bf16_autocast_the_head_runs_in_bf16_and_the_softmax_in_float32():
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(10, 32, generator=generator, requires_grad=True)
    weight = torch.randn(64, 32, generator=generator, requires_grad=True)
    targets = torch.randint(0, 64, (10,), generator=generator)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        values = logprobs.linear_logprobs(hidden, weight, targets, TEMPERATURE)
    logits = (hidden.bfloat16() @ weight.bfloat16().T).float() / TEMPERATURE
    expected = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    assert values.dtype == torch.float32
    torch.testing.assert_close(values, expected)
    values.sum().backward()
    assert hidden.grad.dtype == torch.float32 and weight.grad.dtype == torch.float32
    assert torch.isfinite(hidden.grad).all() and weight.grad.abs().sum() > 0
