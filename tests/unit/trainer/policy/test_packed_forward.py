"""The packed forward (one row, attention per sequence) gives the padded forward's log-probabilities,
losses and gradients.

On the CPU the packed path's attention is SDPA on each sequence in turn (the fallback of
`grpojob_trainer.policy.packing.varlen_attention`); on CUDA the same function calls torch's variable-length
flash kernel instead (checked on the GPU by ``benchmarks/varlen_check.py`` and ``tests/gpu``)."""

from __future__ import annotations

import math

import pytest
import torch

from grpojob_api.v1alpha1 import AdvantageSpec, OptimizerSpec
from grpojob_trainer.algorithm.grpo import LossConfig
from grpojob_trainer.algorithm.samples import TrainingSample
from grpojob_trainer.policy import logprobs, packing
from grpojob_trainer.policy.forward import build_batch, padding_batch, token_logprobs
from grpojob_trainer.policy.learner import PolicyLearner, PreparedBatch
from grpojob_trainer.policy.packing import attention_per_sequence, pack

from .models import tiny_causal_lm

TEMPERATURE = 0.7


def samples(lengths=((3, 4), (2, 1), (5, 7), (1, 2), (6, 1))) -> list[TrainingSample]:
    """One sample of each (prompt, completion) length."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for group, (prompt, completion) in enumerate(lengths):
        ids = torch.randint(1, 64, (prompt + completion,), generator=generator).tolist()
        out.append(
            TrainingSample(
                token_ids=tuple(ids),
                generated_mask=(False,) * prompt + (True,) * completion,
                generation_log_probs=(0.0,) * prompt + (-1.0 - 0.1 * group,) * completion,
                reward=float(group % 2),
                group_index=group // 2,
            )
        )
    return out


def test_pack_lays_the_real_tokens_end_to_end_with_positions_restarting():
    batch = build_batch([samples()[1], samples()[0]], pad_token_id=0)  # lengths 3 and 7
    row = pack(batch.input_ids, batch.attention_mask)
    ids = batch.input_ids.tolist()
    assert row.input_ids.tolist() == [ids[0][:3] + ids[1]]
    assert row.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 5, 6]]
    assert row.cu_seqlens.tolist() == [0, 3, 10] and row.cu_seqlens.dtype == torch.int32
    assert row.max_length == 7
    assert row.keep.tolist() == [0, 1, 3, 4, 5, 6, 7, 8]  # each sequence's last token predicts nothing
    assert row.targets.tolist() == ids[0][1:3] + ids[1][1:]
    assert row.grid.tolist() == [[True, True, False, False, False, False], [True] * 6]


def loss_and_gradients(model: torch.nn.Module, items: list[TrainingSample], packed: bool, autocast: bool = False):
    """Per-token log-probabilities (0 off the loss mask), a weighted sum's gradients."""
    batch = build_batch(items, pad_token_id=0)
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        values = token_logprobs(model, batch, TEMPERATURE, packed=packed)
    weights = torch.linspace(-1.0, 1.0, batch.loss_mask.numel()).view_as(batch.loss_mask)
    (values * weights)[batch.loss_mask].sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return torch.where(batch.loss_mask, values, 0.0).detach(), grads


def assert_same(packed, padded, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    (values, grads), (expected, expected_grads) = packed, padded
    torch.testing.assert_close(values, expected, atol=atol, rtol=rtol)
    assert grads.keys() == expected_grads.keys()
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=atol, rtol=rtol, msg=name)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("head", ["one-chunk", "chunks-recomputed"])
def test_packed_logprobs_and_gradients_equal_the_padded_forwards(tied, head, monkeypatch):
    if head == "chunks-recomputed":  # chunks of 3 positions, their logits recomputed in the backward pass
        monkeypatch.setattr(logprobs, "KEPT_PROBABILITIES_BYTES", 0)
        monkeypatch.setattr(logprobs, "CHUNK_BYTES", 4 * 64 * 3)
    model = tiny_causal_lm(seed=2, tied=tied)
    padded = loss_and_gradients(model, samples(), packed=False)
    assert_same(loss_and_gradients(model, samples(), packed=True), padded)


def test_a_micro_batch_of_one_sequence():
    model = tiny_causal_lm(seed=4)
    one = samples()[2:3]
    assert_same(loss_and_gradients(model, one, packed=True), loss_and_gradients(model, one, packed=False))


def test_under_bf16_autocast_packed_and_padded_agree_within_bf16_rounding():
    model = tiny_causal_lm(seed=5)
    padded = loss_and_gradients(model, samples(), packed=False, autocast=True)
    packed = loss_and_gradients(model, samples(), packed=True, autocast=True)
    assert packed[0].dtype == torch.float32
    assert_same(packed, padded, atol=3e-2, rtol=3e-2)


def test_a_sequence_does_not_see_the_others_packed_with_it():
    model = tiny_causal_lm(seed=3)
    items = samples()
    with torch.no_grad():
        together = token_logprobs(model, build_batch(items, 0), TEMPERATURE, packed=True)
        for row, item in enumerate(items):
            alone = token_logprobs(model, build_batch([item], 0), TEMPERATURE, packed=True)[0]
            n = len(item.token_ids) - 1
            torch.testing.assert_close(together[row, :n], alone[:n], atol=1e-6, rtol=1e-5)


def trainer(packed: bool, **overrides) -> PolicyLearner:
    options = {
        "optimizer": OptimizerSpec(learningRate=1e-2, weightDecay=0.01),
        "loss": LossConfig(kl_coef=0.05),
        "advantage": AdvantageSpec(),
        "micro_batch_size": 2,
        "temperature": TEMPERATURE,
        "pad_token_id": 0,
        "packed": packed,
    }
    return PolicyLearner(tiny_causal_lm(seed=6, tied=True), **(options | overrides))


@pytest.mark.parametrize("mini_batches", [1, 2])
def test_a_packed_train_step_is_the_padded_ones(mini_batches):
    padded, packed = trainer(False, mini_batches=mini_batches), trainer(True, mini_batches=mini_batches)
    assert (padded.packed, packed.packed) == (False, True)
    for _ in range(2):
        expected = padded.train_step(samples())
        metrics = packed.train_step(samples())
        for key, value in expected.items():
            if not key.startswith(("time/", "train_tokens_per_s")):
                assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    for (name, weight), expected in zip(packed.model.named_parameters(), padded.model.parameters(), strict=True):
        torch.testing.assert_close(weight, expected, atol=1e-5, rtol=1e-4, msg=name)


def test_a_padding_micro_batch_adds_nothing_to_the_packed_gradients_or_metrics():
    """What an FSDP2 rank with fewer micro-batches than another runs: an empty loss mask."""
    model_trainer = trainer(True)
    items = samples()
    prepared = model_trainer.prepare(items)
    metrics = model_trainer.accumulate_gradients(prepared)
    grads = [p.grad.clone() for p in model_trainer.model.parameters()]
    filler = padding_batch(items[0], pad_token_id=0)
    with torch.no_grad():
        ref = token_logprobs(model_trainer.reference_model, filler, TEMPERATURE, packed=True)
    normalizer = float(sum(p.batch.generated_tokens for p in prepared))
    with_filler = model_trainer.accumulate_gradients(
        [*prepared, PreparedBatch(batch=filler, advantages=torch.zeros(1), ref_logprobs=ref)], normalizer
    )
    assert with_filler == pytest.approx(metrics)
    for grad, parameter in zip(grads, model_trainer.model.parameters(), strict=True):
        torch.testing.assert_close(parameter.grad, grad)


def test_the_model_keeps_its_own_attention_outside_the_packed_forward():
    model = tiny_causal_lm(seed=7)
    before = model.config._attn_implementation
    with attention_per_sequence(model):
        assert model.config._attn_implementation == packing.VARLEN
    assert model.config._attn_implementation == before


def test_packed_attention_without_sequence_bounds_is_refused_with_a_clear_error():
    model = tiny_causal_lm(seed=7)
    ids = torch.tensor([[1, 2, 3, 4]])
    with attention_per_sequence(model), pytest.raises(ValueError, match="cu_seq_lens_q"):
        model(input_ids=ids, use_cache=False)


def test_on_the_cpu_the_trainer_chooses_the_padded_forward():
    assert trainer(None).packed is False


def test_torch_compile_is_read_from_the_spec_and_ignored_on_the_cpu():
    from grpojob_api.v1alpha1 import GRPOJobSpec

    spec = GRPOJobSpec.model_validate(
        {
            "model": {"path": "runs/tiny-model"},
            "dataset": {"path": "train.jsonl"},
            "environments": [{"name": "digits"}],
            "training": {"torchCompile": True, "microBatchSize": 2},
        }
    )
    assert spec.training.torch_compile
    compiled = PolicyLearner.from_spec(tiny_causal_lm(seed=6, tied=True), spec, pad_token_id=0)
    assert compiled.packed is False  # the CPU: padded, uncompiled
    assert compiled.compiled is False
    assert math.isfinite(compiled.train_step(samples())["loss"])
