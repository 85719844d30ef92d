"""The chunked log-probability head gives the full logits' log-probabilities and gradients, and never holds
a micro-batch's float32 logits over the vocabulary.

The reference is one right-padded forward with the whole ``[B, L, V]`` logits in float32 and a
log-softmax (what `token_logprobs` computed for every micro-batch of up to 8 GiB of such logits before)."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode

from grpojob_trainer.algorithm.samples import TrainingSample
from grpojob_trainer.policy import logprobs
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
@pytest.mark.parametrize("softmax", ["kept", "recomputed"])
def test_the_chunked_head_gives_the_full_logits_values_and_gradients(tied, chunk_positions, softmax, monkeypatch):
    if softmax == "recomputed":
        monkeypatch.setattr(logprobs, "KEPT_PROBABILITIES_BYTES", 0)
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


class LargestVocabularyTensor(TorchDispatchMode):
    """Records the most positions of any float32 tensor over the vocabulary an operation allocates."""

    def __init__(self, vocabulary: int) -> None:
        super().__init__()
        self.vocabulary, self.positions = vocabulary, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:  # views (the head's transposed weight) hold no memory of their own
            return out
        for tensor in out if isinstance(out, tuple | list) else (out,):
            over_vocabulary = (
                isinstance(tensor, torch.Tensor) and tensor.dim() >= 2 and tensor.shape[-1] == self.vocabulary
            )
            if over_vocabulary and tensor.dtype == torch.float32:
                self.positions = max(self.positions, tensor.numel() // self.vocabulary)
        return out


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_a_large_micro_batch_never_holds_its_float32_logits_over_the_vocabulary(packed, monkeypatch):
    monkeypatch.setattr(logprobs, "CHUNK_BYTES", 4 * 64 * 8)  # chunks of 8 positions
    monkeypatch.setattr(logprobs, "KEPT_PROBABILITIES_BYTES", 4 * 64 * 16)  # the micro-batch is larger
    model = tiny_causal_lm(seed=2, intermediate_size=48)  # no other dimension is the vocabulary's 64
    batch = build_batch(samples(), pad_token_id=0)
    assert batch.input_ids.numel() > 16
    with LargestVocabularyTensor(vocabulary=64) as largest:
        values = token_logprobs(model, batch, TEMPERATURE, packed=packed)
        values[batch.loss_mask].sum().backward()
    assert 0 < largest.positions <= 8


def test_a_model_whose_logits_are_soft_capped_gets_the_log_softmax_of_its_own_logits():
    torch.manual_seed(0)
    config = transformers.Gemma2Config(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        final_logit_softcapping=2.0,
    )
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    assert not logprobs.plain_head(model)
    batch = build_batch(samples(), pad_token_id=0)
    expected = torch.where(batch.loss_mask, full_logits_logprobs(model, batch), 0.0)
    values = torch.where(batch.loss_mask, token_logprobs(model, batch, TEMPERATURE), 0.0)
    torch.testing.assert_close(values, expected)
