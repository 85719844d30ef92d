"""GRPO math: hand-computed values, then the vectorised functions against readable loops."""

from __future__ import annotations

import math

import pytest
import torch

from grpojob_api.v1alpha1 import GrpoSpec, KlEstimator, LossAggregation
from grpojob_trainer.algorithm.grpo import (
    KL_CLAMP,
    LossConfig,
    LossInputs,
    aggregate_loss,
    group_advantages,
    group_advantages_matrix,
    importance_weights,
    kl_estimate,
    policy_loss,
    policy_loss_statistics,
)

# --------------------------------------------------------------------------------------------------
# advantages, by hand
#
# Groups interleaved on purpose: group 0 = rewards [1, 0, 0, 1], group 1 = [2, 2], group 2 = [3].
# Group 0: mean 0.5, Bessel std sqrt((4 * 0.25) / 3) = 0.577350; leave-one-out baselines 1/3 (for a 1)
# and 2/3 (for a 0). Group 1 has equal rewards, group 2 a single rollout: both get advantage 0.

REWARDS = torch.tensor([1.0, 2.0, 0.0, 0.0, 2.0, 1.0, 3.0])
GROUPS = torch.tensor([0, 1, 0, 0, 1, 0, 2])


def test_advantages_are_reward_minus_group_mean_over_group_std():
    advantages = group_advantages(REWARDS, GROUPS, normalize_std=True)
    expected = [0.866025, 0.0, -0.866025, -0.866025, 0.0, 0.866025, 0.0]
    assert advantages.tolist() == pytest.approx(expected, abs=1e-5)


def test_advantages_without_std_normalisation_are_reward_minus_group_mean():
    advantages = group_advantages(REWARDS, GROUPS, normalize_std=False)
    assert advantages.tolist() == pytest.approx([0.5, 0.0, -0.5, -0.5, 0.0, 0.5, 0.0], abs=1e-6)


def test_leave_one_out_baselines_each_rollout_with_the_others_of_its_group():
    advantages = group_advantages(REWARDS, GROUPS, normalize_std=False, leave_one_out=True)
    assert advantages.tolist() == pytest.approx([2 / 3, 0.0, -2 / 3, -2 / 3, 0.0, 2 / 3, 0.0], abs=1e-6)
    normalised = group_advantages(REWARDS, GROUPS, normalize_std=True, leave_one_out=True)
    assert normalised.tolist() == pytest.approx([1.154701, 0.0, -1.154701, -1.154701, 0.0, 1.154701, 0.0], abs=1e-5)


def test_group_ids_need_not_be_contiguous():
    assert group_advantages(torch.tensor([1.0, 5.0, 0.0]), torch.tensor([7, 3, 7]), normalize_std=False).tolist() == [
        0.5,
        0.0,
        -0.5,
    ]


def test_matrix_layout_is_one_group_per_row():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 4.0]])
    advantages = group_advantages_matrix(rewards, normalize_std=False)
    assert advantages.tolist() == [[0.5, -0.5, -0.5, 0.5], [-1.0, -1.0, -1.0, 3.0]]


def test_advantages_refuse_mismatched_shapes():
    with pytest.raises(ValueError, match=r"\[B\]"):
        group_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.long))


# --------------------------------------------------------------------------------------------------
# the loss, by hand


def _inputs_from_ratios(ratios, advantages, mask, **extra) -> LossInputs:
    """old_logprobs = -1 everywhere; logprobs chosen so that exp(logp - old) equals ``ratios``."""
    old = torch.full((len(ratios), len(ratios[0])), -1.0, dtype=torch.float64)
    logprobs = (old + torch.tensor(ratios, dtype=torch.float64).log()).requires_grad_()
    return LossInputs(
        logprobs=logprobs,
        old_logprobs=old,
        generation_logprobs=extra.pop("generation_logprobs", old.clone()),
        advantages=torch.tensor(advantages, dtype=torch.float64),
        mask=torch.tensor(mask),
        **extra,
    )


# Sequence 0 has advantage +1: per-token loss -min(r, clip(r, 0.8, 1.28)) = [-1, -1.28, -0.5, (masked)].
# Sequence 1 has advantage -2: per-token loss -min(-2r, -2 clip(r)) = [(masked), (masked), 1.6, 1.6].
RATIOS = [[1.0, 1.5, 0.5, 1.1], [1.0, 1.5, 0.5, 0.7]]
ADVANTAGES = [1.0, -2.0]
MASK = [[True, True, True, False], [False, False, True, True]]


def test_token_aggregation_is_the_mean_over_all_generated_tokens():
    config = LossConfig(clip_low=0.2, clip_high=0.28, importance_sampling_cap=None, aggregation="token")
    loss, metrics = policy_loss(_inputs_from_ratios(RATIOS, ADVANTAGES, MASK), config)
    # (-1 - 1.28 - 0.5 + 1.6 + 1.6) / 5
    assert loss.item() == pytest.approx(0.084)
    assert metrics["loss"] == pytest.approx(0.084)
    assert metrics["ratio_mean"] == pytest.approx((1.0 + 1.5 + 0.5 + 0.5 + 0.7) / 5)
    assert metrics["ratio_max"] == pytest.approx(1.5)
    assert metrics["clip_frac_high"] == pytest.approx(1 / 5)  # r=1.5 with A>0
    assert metrics["clip_frac_low"] == pytest.approx(2 / 5)  # r=0.5 and r=0.7 with A<0
    assert metrics["is_weight_mean"] == 1.0
    assert "kl" not in metrics


def test_the_training_loop_reads_the_diagnostics_as_device_tensors_the_same_as_policy_losss_floats():
    config = LossConfig(importance_sampling_cap=2.0)
    inputs = _inputs_from_ratios(RATIOS, ADVANTAGES, MASK)

    loss, statistics = policy_loss_statistics(inputs, config)
    _, metrics = policy_loss(inputs, config)

    # 0-dim tensors, not floats: reading none of them waits for the accelerator until the step's end.
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad for v in statistics.values())
    assert {key: value.item() for key, value in statistics.items()} == pytest.approx(metrics)
    assert loss.requires_grad


def test_the_maxima_of_a_batch_without_generated_tokens_are_0_as_floats_and_minus_infinity_as_tensors():
    inputs = _inputs_from_ratios(RATIOS, ADVANTAGES, [[False] * 4, [False] * 4])

    _, statistics = policy_loss_statistics(inputs, LossConfig(), normalizer=1.0)
    _, metrics = policy_loss(inputs, LossConfig(), normalizer=1.0)

    assert statistics["ratio_max"].item() == -math.inf
    assert metrics["ratio_max"] == 0.0 and metrics["is_weight_max"] == 0.0
    assert metrics["ratio_mean"] == 0.0


def test_sequence_aggregation_is_the_mean_of_per_sequence_means():
    config = LossConfig(clip_low=0.2, clip_high=0.28, importance_sampling_cap=None, aggregation="sequence")
    loss, _ = policy_loss(_inputs_from_ratios(RATIOS, ADVANTAGES, MASK), config)
    # ((-1 - 1.28 - 0.5) / 3 + (1.6 + 1.6) / 2) / 2
    assert loss.item() == pytest.approx(0.336667, abs=1e-6)


def test_clipped_tokens_get_no_gradient_and_the_others_do():
    config = LossConfig(clip_low=0.2, clip_high=0.28, importance_sampling_cap=None, aggregation="token")
    inputs = _inputs_from_ratios([[1.0, 1.5, 0.5, 1.1]], [1.0], [[True, True, True, True]])
    loss, _ = policy_loss(inputs, config)
    loss.backward()
    # d/dlogp of -r*A/4 is -r*A/4; zero where the clipped branch (r=1.5 > 1.28 with A>0) is taken.
    assert inputs.logprobs.grad[0].tolist() == pytest.approx([-0.25, 0.0, -0.125, -0.275])


def test_padding_and_prompt_tokens_never_reach_the_loss_even_when_not_finite():
    config = LossConfig(importance_sampling_cap=None)
    inputs = _inputs_from_ratios([[1.0, 1.0]], [1.0], [[True, False]])
    inputs.generation_logprobs[0, 1] = float("-inf")
    with torch.no_grad():
        inputs.logprobs[0, 1] = float("nan")
    loss, _ = policy_loss(inputs, config)
    assert loss.item() == -1.0


def test_importance_weights_are_capped_trainer_over_generator_probability_ratios():
    old = torch.tensor([[-1.0, -1.0, -1.0]])
    gen = torch.tensor([[-1.0, -1.5, -3.0]])
    # exp(0) = 1, exp(0.5) = 1.648721, exp(2) = 7.389 → capped at 2
    assert importance_weights(old, gen, cap=2.0)[0].tolist() == pytest.approx([1.0, 1.648721, 2.0], abs=1e-6)
    assert importance_weights(old, gen, cap=None).tolist() == [[1.0, 1.0, 1.0]]


def test_importance_weights_scale_each_tokens_loss_and_gradient():
    old = torch.tensor([[-1.0, -1.0, -1.0]], dtype=torch.float64)
    inputs = LossInputs(
        logprobs=old.clone().requires_grad_(),
        old_logprobs=old,
        generation_logprobs=torch.tensor([[-1.0, -1.5, -3.0]], dtype=torch.float64),
        advantages=torch.tensor([1.0], dtype=torch.float64),
        mask=torch.tensor([[True, True, True]]),
    )
    loss, metrics = policy_loss(inputs, LossConfig(importance_sampling_cap=2.0))
    loss.backward()
    assert loss.item() == pytest.approx(-(1.0 + 1.648721 + 2.0) / 3, abs=1e-6)
    assert inputs.logprobs.grad[0].tolist() == pytest.approx([-1 / 3, -1.648721 / 3, -2 / 3], abs=1e-6)
    assert metrics["is_weight_mean"] == pytest.approx(1.549574, abs=1e-6)
    assert metrics["is_weight_max"] == pytest.approx(2.0)
    assert metrics["is_capped_frac"] == pytest.approx(1 / 3)
    assert metrics["gen_logprob_abs_diff"] == pytest.approx(2.5 / 3)


def test_kl_estimators_k1_and_k3():
    logprobs = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    assert kl_estimate(logprobs, ref, "k1")[0].tolist() == pytest.approx([0.5, -1.0])
    # exp(ref - logp) - (ref - logp) - 1: exp(-0.5) + 0.5 - 1 and exp(1) - 1 - 1
    assert kl_estimate(logprobs, ref, "k3")[0].tolist() == pytest.approx([0.106531, 0.718282], abs=1e-6)
    assert float(kl_estimate(torch.tensor([-50.0]), torch.tensor([0.0]), "k3")) == KL_CLAMP


def test_kl_penalty_is_added_per_token_with_its_coefficient():
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    inputs = LossInputs(
        logprobs=logprobs,
        old_logprobs=logprobs.detach(),
        generation_logprobs=logprobs.detach(),
        advantages=torch.tensor([0.0]),
        mask=torch.tensor([[True, True]]),
        ref_logprobs=torch.tensor([[-1.5, -1.0]]),
    )
    loss, metrics = policy_loss(inputs, LossConfig(kl_coef=0.1, kl_estimator="k3"))
    assert loss.item() == pytest.approx(0.1 * (0.106531 + 0.718282) / 2, abs=1e-6)
    assert metrics["kl"] == pytest.approx((0.106531 + 0.718282) / 2, abs=1e-6)


def test_kl_coefficient_without_reference_logprobs_is_an_error():
    inputs = _inputs_from_ratios([[1.0]], [1.0], [[True]])
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(inputs, LossConfig(kl_coef=0.1))


def test_loss_config_comes_from_the_grpo_spec():
    spec = GrpoSpec(clipLow=0.1, clipHigh=0.3, klCoef=0.05, klEstimator="k1", importanceSamplingCap=None)
    config = LossConfig.from_spec(spec.model_copy(update={"loss_aggregation": "sequence"}))
    assert config.kl_estimator is KlEstimator.K1 and config.aggregation is LossAggregation.SEQUENCE
    assert config == LossConfig(
        clip_low=0.1,
        clip_high=0.3,
        kl_coef=0.05,
        kl_estimator="k1",
        importance_sampling_cap=None,
        aggregation="sequence",
    )


def test_micro_batch_losses_with_the_step_normaliser_add_up_to_the_whole_batch_loss():
    torch.manual_seed(0)
    per_token = torch.randn(6, 5)
    mask = torch.rand(6, 5) > 0.3
    for mode, normalizer in (("token", float(mask.sum())), ("sequence", 6.0)):
        whole = aggregate_loss(per_token, mask, mode)
        parts = sum(
            aggregate_loss(per_token[i : i + 2], mask[i : i + 2], mode, normalizer=normalizer) for i in (0, 2, 4)
        )
        assert float(parts) == pytest.approx(float(whole), abs=1e-6)


# --------------------------------------------------------------------------------------------------
# equivalence: readable loops against the vectorised functions


def loop_advantages(rewards: list[float], groups: list[int], normalize_std: bool, leave_one_out: bool) -> list[float]:
    out = []
    for i, reward in enumerate(rewards):
        members = [rewards[j] for j in range(len(rewards)) if groups[j] == groups[i]]
        if len(members) == 1:
            out.append(0.0)
            continue
        mean = sum(members) / len(members)
        baseline = (sum(members) - reward) / (len(members) - 1) if leave_one_out else mean
        advantage = reward - baseline
        if normalize_std:
            std = math.sqrt(sum((m - mean) ** 2 for m in members) / (len(members) - 1))
            advantage /= std + 1e-6
        out.append(advantage)
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("size,groups", [(1, 1), (6, 2), (17, 5), (64, 8)])
@pytest.mark.parametrize("normalize_std", [True, False])
@pytest.mark.parametrize("leave_one_out", [True, False])
def test_vectorised_advantages_match_a_loop(seed, size, groups, normalize_std, leave_one_out):
    generator = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (size,), generator=generator).double() / 2
    group_ids = torch.randint(0, groups, (size,), generator=generator)
    vectorised = group_advantages(rewards, group_ids, normalize_std=normalize_std, leave_one_out=leave_one_out)
    expected = loop_advantages(rewards.tolist(), group_ids.tolist(), normalize_std, leave_one_out)
    assert vectorised.tolist() == pytest.approx(expected, rel=1e-9, abs=1e-9)


def loop_policy_loss(inputs: LossInputs, config: LossConfig) -> tuple[float, dict[str, float]]:
    """The GRPO loss written one token at a time with Python floats."""
    size, length = inputs.mask.shape
    token_losses: list[list[float]] = []
    ratios, weights, kls, clip_low, clip_high = [], [], [], 0, 0
    for b in range(size):
        advantage = float(inputs.advantages[b])
        row = []
        for t in range(length):
            if not inputs.mask[b, t]:
                continue
            logp, old, gen = (
                float(x[b, t]) for x in (inputs.logprobs, inputs.old_logprobs, inputs.generation_logprobs)
            )
            ratio = math.exp(logp - old)
            clipped = min(max(ratio, 1 - config.clip_low), 1 + config.clip_high)
            loss = -min(ratio * advantage, clipped * advantage)
            weight = 1.0
            if config.importance_sampling_cap is not None:
                weight = min(math.exp(old - gen), config.importance_sampling_cap)
            loss *= weight
            if inputs.ref_logprobs is not None:
                ref = float(inputs.ref_logprobs[b, t])
                if config.kl_estimator == "k1":
                    kl = logp - ref
                else:
                    kl = min(max(math.exp(ref - logp) - (ref - logp) - 1, -KL_CLAMP), KL_CLAMP)
                kls.append(kl)
                loss += config.kl_coef * kl
            row.append(loss)
            ratios.append(ratio)
            weights.append(weight)
            clip_low += ratio < 1 - config.clip_low and advantage < 0
            clip_high += ratio > 1 + config.clip_high and advantage > 0
        token_losses.append(row)
    tokens = [loss for row in token_losses for loss in row]
    if config.aggregation == "token":
        total = sum(tokens) / max(len(tokens), 1)
    else:
        total = sum(sum(row) / max(len(row), 1) for row in token_losses) / size
    n = max(len(tokens), 1)
    metrics = {
        "loss": total,
        "ratio_mean": sum(ratios) / n,
        "clip_frac_low": clip_low / n,
        "clip_frac_high": clip_high / n,
        "is_weight_mean": sum(weights) / n,
        "is_weight_max": max(weights, default=0.0),
    }
    if kls:
        metrics["kl"] = sum(kls) / n
    return total, metrics


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("size,length", [(1, 1), (3, 7), (8, 33)])
@pytest.mark.parametrize("aggregation", ["token", "sequence"])
@pytest.mark.parametrize(
    "kl_coef,estimator,cap", [(0.0, "k3", None), (0.0, "k3", 2.0), (0.05, "k1", 1.5), (0.05, "k3", None)]
)
def test_vectorised_loss_matches_a_loop(seed, size, length, aggregation, kl_coef, estimator, cap):
    generator = torch.Generator().manual_seed(seed)

    def logprobs() -> torch.Tensor:
        return -torch.rand(size, length, generator=generator, dtype=torch.float64) * 3

    old = logprobs()
    inputs = LossInputs(
        logprobs=old + 0.4 * torch.randn(size, length, generator=generator, dtype=torch.float64),
        old_logprobs=old,
        generation_logprobs=old + 0.3 * torch.randn(size, length, generator=generator, dtype=torch.float64),
        advantages=torch.randn(size, generator=generator, dtype=torch.float64),
        mask=torch.rand(size, length, generator=generator) > 0.3,
        ref_logprobs=logprobs() if kl_coef > 0 else None,
    )
    inputs.mask[:, 0] = True  # every sequence has a generated token
    config = LossConfig(
        clip_low=0.2,
        clip_high=0.28,
        kl_coef=kl_coef,
        kl_estimator=estimator,
        importance_sampling_cap=cap,
        aggregation=aggregation,
    )
    loss, metrics = policy_loss(inputs, config)
    expected_loss, expected_metrics = loop_policy_loss(inputs, config)
    assert loss.item() == pytest.approx(expected_loss, rel=1e-9, abs=1e-12)
    for key, value in expected_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
