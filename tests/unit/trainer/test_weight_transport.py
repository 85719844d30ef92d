"""Weight transport: bucketing, and a push that leaves the generation model equal to the trained policy."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import torch

from grpojob_api.v1alpha1 import AdvantageSpec, OptimizerSpec
from grpojob_trainer.grpo import LossConfig
from grpojob_trainer.policy import PolicyTrainer
from grpojob_trainer.samples import TrainingSample
from grpojob_trainer.weights import InProcessWeightTransport, WeightReceiver, bucket_by_size, copy_into

from .models import tiny_causal_lm


class GenerationModel:
    """A stand-in generation backend: a plain HF model that accepts weights by name."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.calls = 0

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.calls += 1
        copy_into(self.model, named_tensors)


def trained_policy() -> PolicyTrainer:
    policy = PolicyTrainer(
        tiny_causal_lm(seed=0),
        optimizer=OptimizerSpec(learningRate=1e-2),
        loss=LossConfig(),
        advantage=AdvantageSpec(),
        micro_batch_size=2,
        temperature=1.0,
        pad_token_id=0,
    )
    samples = [
        TrainingSample((1, 2, 3, 4), (False, False, True, True), (0.0, 0.0, -4.0, -4.0), reward=1.0, group_index=0),
        TrainingSample((1, 2, 5, 6), (False, False, True, True), (0.0, 0.0, -4.0, -4.0), reward=0.0, group_index=0),
    ]
    policy.train_step(samples)
    return policy


def assert_same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> None:
    b_params = dict(b.named_parameters())
    assert b_params.keys() == dict(a.named_parameters()).keys()
    for name, param in a.named_parameters():
        assert torch.equal(param.to(b_params[name].dtype), b_params[name]), name


def named(sizes: dict[str, int]) -> list[tuple[str, torch.Tensor]]:
    return [(name, torch.zeros(numel, dtype=torch.float32)) for name, numel in sizes.items()]


def test_buckets_fill_in_order_up_to_the_byte_limit():
    tensors = named({"a": 4, "b": 2, "c": 10, "d": 1})  # 16, 8, 40 and 4 bytes
    buckets = [[name for name, _ in bucket] for bucket in bucket_by_size(tensors, bucket_bytes=24)]
    assert buckets == [["a", "b"], ["c"], ["d"]]  # c is larger than a bucket: alone
    assert [[n for n, _ in b] for b in bucket_by_size(tensors, bucket_bytes=1000)] == [["a", "b", "c", "d"]]
    assert list(bucket_by_size([], bucket_bytes=8)) == []


def test_after_a_training_step_and_a_push_the_generation_model_has_the_policy_weights():
    policy = trained_policy()
    receiver = GenerationModel(tiny_causal_lm(seed=1))
    assert isinstance(receiver, WeightReceiver)
    metrics = InProcessWeightTransport(receiver).push(policy.model)
    assert_same_parameters(policy.model, receiver.model)
    assert receiver.calls == 1
    assert metrics["weight_sync/tensors"] == len(list(policy.model.parameters()))
    assert metrics["weight_sync/bytes"] == sum(p.numel() * 4 for p in policy.model.parameters())


def test_a_bucketed_push_calls_the_receiver_once_per_bucket():
    policy = trained_policy()
    receivers = [GenerationModel(tiny_causal_lm(seed=1)), GenerationModel(tiny_causal_lm(seed=2))]
    metrics = InProcessWeightTransport(receivers, bucket_bytes=8192).push(policy.model)
    assert metrics["weight_sync/buckets"] > 1
    for receiver in receivers:
        assert receiver.calls == metrics["weight_sync/buckets"]
        assert_same_parameters(policy.model, receiver.model)


def test_the_receiver_holds_copies_and_converts_dtype():
    policy = trained_policy()
    receiver = GenerationModel(tiny_causal_lm(seed=1).to(torch.bfloat16))
    InProcessWeightTransport(receiver).push(policy.model)
    assert_same_parameters(policy.model, receiver.model)
    with torch.no_grad():
        next(policy.model.parameters()).add_(1.0)
    assert not torch.equal(next(policy.model.parameters()).bfloat16(), next(receiver.model.parameters()))


def test_copy_into_refuses_unknown_names_and_wrong_shapes():
    model = tiny_causal_lm(seed=0)
    with pytest.raises(KeyError, match="no parameter"):
        copy_into(model, [("model.nope.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="shape"):
        copy_into(model, [("model.embed_tokens.weight", torch.zeros(2, 2))])
