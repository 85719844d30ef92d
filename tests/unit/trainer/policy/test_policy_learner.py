"""Policy training on a tiny random-initialised Qwen2: alignment, direction of the update, accumulation."""

from __future__ import annotations

import math

import pytest
import torch

from grpojob_api.v1alpha1 import AdvantageSpec, GRPOJobSpec, OptimizerSpec
from grpojob_trainer.algorithm.grpo import LossConfig
from grpojob_trainer.algorithm.samples import TrainingSample
from grpojob_trainer.observability.metrics import StepTimer
from grpojob_trainer.policy.forward import build_batch, token_logprobs
from grpojob_trainer.policy.learner import PolicyLearner

from .models import tiny_causal_lm

PAD = 0


def sample(
    prompt: list[int], completion: list[int], reward: float, group: int, logprob: float = -1.0
) -> TrainingSample:
    return TrainingSample(
        token_ids=(*prompt, *completion),
        generated_mask=(False,) * len(prompt) + (True,) * len(completion),
        generation_log_probs=(0.0,) * len(prompt) + (logprob,) * len(completion),
        reward=reward,
        group_index=group,
    )


def trainer(model: torch.nn.Module, **overrides) -> PolicyLearner:
    options = {
        "optimizer": OptimizerSpec(learningRate=1e-3),
        "loss": LossConfig(importance_sampling_cap=None),
        "advantage": AdvantageSpec(),
        "micro_batch_size": 4,
        "temperature": 1.0,
        "pad_token_id": PAD,
    }
    return PolicyLearner(model, **(options | overrides))


def test_batch_is_right_padded_with_targets_shifted_by_one():
    batch = build_batch(
        [sample([5, 6], [7], reward=1.0, group=0, logprob=-0.5), sample([5], [8, 9, 10], reward=0.0, group=3)], PAD
    )
    assert batch.input_ids.tolist() == [[5, 6, 7, 0], [5, 8, 9, 10]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert batch.target_ids.tolist() == [[6, 7, 0], [8, 9, 10]]
    assert batch.loss_mask.tolist() == [[False, True, False], [True, True, True]]
    assert batch.generation_logprobs.tolist() == [[0.0, -0.5, 0.0], [-1.0, -1.0, -1.0]]
    assert batch.rewards.tolist() == [1.0, 0.0]
    assert batch.group_ids.tolist() == [0, 3]
    assert (batch.tokens, batch.generated_tokens) == (7, 4)


def test_logprob_of_each_token_equals_a_manual_forward_over_its_prefix():
    model = tiny_causal_lm()
    short = [3, 14, 15, 9, 26]
    batch = build_batch([sample(short[:2], short[2:], 0.0, 0), sample([1, 2, 3], [4, 5, 6, 7, 8], 0.0, 0)], PAD)
    temperature = 0.7
    with torch.no_grad():
        batched = token_logprobs(model, batch, temperature)
        for t in range(len(short) - 1):
            logits = model(input_ids=torch.tensor([short[: t + 1]])).logits[0, -1]
            manual = torch.log_softmax(logits / temperature, dim=-1)[short[t + 1]]
            assert batched[0, t].item() == pytest.approx(manual.item(), abs=1e-5)


def sequence_logprob(model: torch.nn.Module, item: TrainingSample) -> float:
    batch = build_batch([item], PAD)
    with torch.no_grad():
        return float(token_logprobs(model, batch, 1.0)[batch.loss_mask].sum())


def test_a_step_makes_positive_advantage_sequences_likelier_and_negative_ones_less_likely():
    model = tiny_causal_lm()
    prompt = [1, 2, 3]
    samples = [
        sample(prompt, [10, 11, 12], reward=1.0, group=0),
        sample(prompt, [20, 21, 22], reward=0.0, group=0),
        sample([4, 5], [30, 31], reward=0.0, group=1),
        sample([4, 5], [40, 41], reward=1.0, group=1),
    ]
    before = [sequence_logprob(model, s) for s in samples]
    metrics = trainer(model, micro_batch_size=2).train_step(samples)
    after = [sequence_logprob(model, s) for s in samples]
    assert after[0] > before[0] and after[3] > before[3]
    assert after[1] < before[1] and after[2] < before[2]
    assert metrics["grad_norm"] > 0
    assert metrics["reward_mean"] == 0.5
    assert metrics["tokens"] == 20 and metrics["generated_tokens"] == 10


def varied_samples() -> list[TrainingSample]:
    return [
        sample([1, 2, 3], [10, 11, 12, 13], reward=1.0, group=0, logprob=-3.0),
        sample([1, 2, 3], [20], reward=0.0, group=0, logprob=-4.0),
        sample([1, 2, 3], [30, 31, 32, 33, 34, 35], reward=0.5, group=0, logprob=-4.5),
        sample([7, 8], [40, 41], reward=0.0, group=1, logprob=-3.5),
        sample([7, 8], [50, 51, 52], reward=2.0, group=1, logprob=-4.0),
    ]


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_micro_batched_gradients_equal_the_gradients_of_one_batch(aggregation):
    gradients, losses = [], []
    for micro_batch_size in (5, 2, 1):
        policy = trainer(
            tiny_causal_lm(seed=1),
            micro_batch_size=micro_batch_size,
            loss=LossConfig(importance_sampling_cap=2.0, kl_coef=0.1, aggregation=aggregation),
        )
        metrics = policy.accumulate_gradients(policy.prepare(varied_samples()))
        gradients.append({name: p.grad.clone() for name, p in policy.model.named_parameters()})
        losses.append(metrics["loss"])
    assert policy.loss_config.aggregation == aggregation
    for other, loss in zip(gradients[1:], losses[1:], strict=True):
        assert loss == pytest.approx(losses[0], abs=1e-6)
        for name, grad in gradients[0].items():
            torch.testing.assert_close(other[name], grad, atol=1e-6, rtol=1e-4, msg=name)


def test_kl_penalty_is_taken_against_a_frozen_copy_of_the_initial_policy():
    policy = trainer(tiny_causal_lm(), loss=LossConfig(kl_coef=0.5), optimizer=OptimizerSpec(learningRate=1e-2))
    initial = {name: p.clone() for name, p in policy.model.named_parameters()}
    first = policy.train_step(varied_samples())
    second = policy.train_step(varied_samples())
    assert first["kl"] == pytest.approx(0.0, abs=1e-7)
    assert second["kl"] > 0
    for name, param in policy.reference_model.named_parameters():
        assert torch.equal(param, initial[name]) and not param.requires_grad


def test_the_reported_grad_norm_is_the_global_norm_before_clipping():
    policy = trainer(tiny_causal_lm(), optimizer=OptimizerSpec(maxGradNorm=1e-3))
    policy.accumulate_gradients(policy.prepare(varied_samples()))
    params = [p for p in policy.model.parameters() if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
    metrics = policy.optimizer_step()
    assert metrics["grad_norm"] == pytest.approx(float(norm), rel=1e-5)
    assert metrics["grad_norm"] > 1e-3


def test_a_step_is_timed_in_a_prepare_and_a_training_phase_and_its_throughput_is_over_the_training_phase():
    readings = iter([10.0, 12.0, 20.0, 24.0])  # prepare: 2 s; training: 4 s
    timer = StepTimer(clock=lambda: next(readings))
    metrics = trainer(tiny_causal_lm()).train_step(varied_samples(), timer=timer)
    assert timer.seconds == {"prepare": 2.0, "training": 4.0}
    assert (metrics["time/prepare"], metrics["time/training"]) == (2.0, 4.0)
    assert metrics["tokens"] == 29 and metrics["train_tokens_per_s"] == 29 / 4.0


def test_greedy_temperature_is_refused():
    with pytest.raises(ValueError, match="temperature"):
        trainer(tiny_causal_lm(), temperature=0.0)


def test_a_trainer_is_configured_from_the_grpojob_spec():
    spec = GRPOJobSpec.model_validate(
        {
            "model": {"path": "runs/tiny-model"},
            "dataset": {"path": "train.jsonl"},
            "environments": [{"name": "digits"}],
            "generation": {"temperature": 0.8},
            "training": {"microBatchSize": 3, "optimizer": {"learningRate": 0.002, "maxGradNorm": 0.5}},
            "grpo": {"klCoef": 0.01, "lossAggregation": "sequence", "advantage": {"leaveOneOut": True}},
        }
    )
    policy = PolicyLearner.from_spec(tiny_causal_lm(), spec, pad_token_id=PAD)
    assert (policy.micro_batch_size, policy.temperature, policy.max_grad_norm) == (3, 0.8, 0.5)
    assert policy.optimizer.param_groups[0]["lr"] == 0.002
    assert policy.loss_config == LossConfig.from_spec(spec.grpo)
    assert policy.advantage.leave_one_out and policy.reference_model is not None


def test_grpo_steps_raise_the_mean_reward_of_a_one_token_bandit():
    """Sample one token after each of 4 prompts, 8 times; reward 1 for a token id below 16 (a quarter of them)."""
    model = tiny_causal_lm()
    policy = trainer(model, optimizer=OptimizerSpec(learningRate=3e-3), micro_batch_size=16)
    rewards = []
    for _ in range(20):
        samples = []
        for group in range(4):
            prompt = [1 + group, 5]
            with torch.no_grad():
                log_probs = torch.log_softmax(model(input_ids=torch.tensor([prompt] * 8)).logits[:, -1].float(), -1)
            tokens = torch.multinomial(log_probs.exp(), 1).squeeze(-1)
            for token in tokens.tolist():
                samples.append(sample(prompt, [token], float(token < 16), group, float(log_probs[0, token])))
        rewards.append(policy.train_step(samples)["reward_mean"])
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.25


def reference_step_loss(
    model: torch.nn.Module,
    reference: torch.nn.Module,
    samples: list[TrainingSample],
    *,
    temperature: float,
    cap: float,
    kl_coef: float,
    aggregation: str,
) -> torch.Tensor:
    """The GRPO loss of one step written out sequence by sequence and token by token, sharing no code with
    `grpojob_trainer.algorithm.grpo` or `grpojob_trainer.policy.learner`: each sequence's log-probabilities from a
    forward over that sequence alone; advantages (reward - group mean) / (group std + 1e-6); and, since every
    forward of the step runs with the weights that sampled it (one optimizer step per GRPO step), the
    ratio exp(logp - old logp) with the old log-probability the same value, detached."""
    per_sequence_losses, per_sequence_tokens = [], []
    for item in samples:
        group = [s.reward for s in samples if s.group_index == item.group_index]
        mean = sum(group) / len(group)
        std = (sum((r - mean) ** 2 for r in group) / (len(group) - 1)) ** 0.5
        advantage = (item.reward - mean) / (std + 1e-6)
        ids = torch.tensor([item.token_ids])
        logp_all = torch.log_softmax(model(input_ids=ids).logits[0].float() / temperature, dim=-1)
        with torch.no_grad():
            ref_all = torch.log_softmax(reference(input_ids=ids).logits[0].float() / temperature, dim=-1)
        token_losses = []
        for t in range(1, len(item.token_ids)):
            if not item.generated_mask[t]:
                continue
            logp, ref = logp_all[t - 1, item.token_ids[t]], ref_all[t - 1, item.token_ids[t]]
            ratio = torch.exp(logp - logp.detach())
            weight = min(math.exp(float(logp.detach()) - item.generation_log_probs[t]), cap)
            kl = torch.clamp(torch.exp(ref - logp) - (ref - logp) - 1, -10, 10)
            token_losses.append(-weight * ratio * advantage + kl_coef * kl)
        per_sequence_losses.append(torch.stack(token_losses).sum())
        per_sequence_tokens.append(len(token_losses))
    if aggregation == "token":
        return sum(per_sequence_losses) / sum(per_sequence_tokens)
    return sum(loss / n for loss, n in zip(per_sequence_losses, per_sequence_tokens, strict=True)) / len(samples)


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_the_steps_loss_and_gradient_equal_a_token_by_token_reference(aggregation):
    """Micro-batched, padded, at temperature 0.7, with importance weights (some capped) and a KL penalty
    against another model: the trainer's loss and gradient are those of the loss written out by hand. A
    ratio without gradient (old log-probabilities not detached) or a wrong advantage, weight, mask or
    normaliser makes them differ."""
    config = LossConfig(importance_sampling_cap=1.2, kl_coef=0.3, aggregation=aggregation)
    reference = tiny_causal_lm(seed=3)
    policy = trainer(
        tiny_causal_lm(seed=2), micro_batch_size=2, loss=config, temperature=0.7, reference_model=reference
    )
    metrics = policy.accumulate_gradients(policy.prepare(varied_samples()))
    ours = {name: p.grad.clone() for name, p in policy.model.named_parameters()}

    policy.optimizer.zero_grad(set_to_none=True)
    expected = reference_step_loss(
        policy.model, reference, varied_samples(), temperature=0.7, cap=1.2, kl_coef=0.3, aggregation=aggregation
    )
    expected.backward()

    assert metrics["loss"] == pytest.approx(float(expected.detach()), abs=1e-6)
    assert 0 < metrics["is_capped_frac"] < 1, "the samples exercise the importance-weight cap"
    for name, param in policy.model.named_parameters():
        torch.testing.assert_close(ours[name], param.grad, atol=1e-7, rtol=1e-4, msg=name)
    assert any(float(g.abs().max()) > 0 for g in ours.values())


def optimizer_steps_taken(policy: PolicyLearner) -> int:
    (steps,) = {int(state["step"]) for state in policy.optimizer.state.values()}
    return steps


def test_one_mini_batch_is_one_optimizer_step_with_the_ratio_exactly_one():
    policy = trainer(tiny_causal_lm(), optimizer=OptimizerSpec(learningRate=0.5))
    metrics = policy.train_step(varied_samples())
    assert optimizer_steps_taken(policy) == 1 and metrics["optimizer_steps"] == 1
    assert metrics["ratio_max"] == pytest.approx(1.0)
    assert metrics["clip_frac_low"] == metrics["clip_frac_high"] == 0.0


def test_mini_batches_take_one_optimizer_step_each_against_the_policy_before_the_first():
    """With a large learning rate the first update moves the policy far; the later mini-batches' ratios
    (against the log-probabilities from before it) leave the clip range, and the clip takes effect."""
    policy = trainer(tiny_causal_lm(), optimizer=OptimizerSpec(learningRate=0.5), mini_batches=3)
    metrics = policy.train_step(varied_samples() * 2)
    assert optimizer_steps_taken(policy) == 3 and metrics["optimizer_steps"] == 3
    assert metrics["ratio_max"] > 1.0 + policy.loss_config.clip_high
    assert metrics["clip_frac_low"] + metrics["clip_frac_high"] > 0
