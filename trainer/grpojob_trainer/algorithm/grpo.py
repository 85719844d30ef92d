"""GRPO math: group-relative advantages and the PPO-clipped token-level loss, as small pure functions.

Shapes used throughout: ``B`` sequences in the batch, ``T`` token positions per sequence (targets, i.e.
already shifted so that position ``t`` holds the log-probability of token ``t + 1`` given the prefix up
to ``t``), ``G`` groups of ``N`` rollouts each. Masks are boolean and true on generated tokens only;
every per-token quantity is zeroed where the mask is false, so prompt, tool-output and padding tokens
never contribute to the loss or to the metrics.

The per-token loss of a generated token is

    w_is * -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A)  +  kl_coef * KL

with ``r = exp(logp - old_logp)`` (the PPO ratio against the policy that generated the batch: while a
step takes one optimizer step, ``old_logp`` is the training forward's own log-probability, detached, so
``r`` is 1 in value), ``A`` the sequence's advantage, ``w_is = min(exp(old_logp - gen_logp), cap)`` the
detached truncated importance-sampling weight that corrects for the generation engine's numerics
differing from the trainer's (applied to the policy-gradient term only, as verl and NeMo-RL do), and
``KL`` a per-token estimate of KL(policy || reference). `aggregate_loss` turns it into a scalar.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grpojob_api.v1alpha1 import GrpoSpec, KlEstimator, LossAggregation

ADVANTAGE_EPS = 1e-6
"""Added to the group standard deviation before dividing (a group with equal rewards gets advantage 0)."""
KL_CLAMP = 10.0
"""The k3 estimate is clamped to [-KL_CLAMP, KL_CLAMP] (verl's `low_var_kl`), so that one token whose
probability collapsed cannot produce an infinite loss."""


# --------------------------------------------------------------------------------------------------
# advantages


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    normalize_std: bool = True,
    leave_one_out: bool = False,
    eps: float = ADVANTAGE_EPS,
) -> torch.Tensor:
    """Group-relative advantages of one step's rollouts.

    Args:
        rewards: ``[B]`` float, one scalar reward per rollout.
        group_ids: ``[B]`` integer; rollouts with equal ids (the same dataset row) form one group.
            Groups may differ in size (a failed rollout leaves its group one short).
        normalize_std: divide by the group's reward standard deviation (Bessel-corrected, as
            ``torch.std``) plus ``eps``; false is Dr. GRPO's variant.
        leave_one_out: baseline each rollout with the mean reward of the *other* rollouts of its group
            (RLOO) instead of the group mean.
        eps: added to the standard deviation.

    Returns:
        ``[B]`` advantages, in ``rewards``' dtype. A group of one rollout has no baseline to compare
        against and gets advantage 0.
    """
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both be [B], got {tuple(rewards.shape)}, {tuple(group_ids.shape)}"
        )
    rewards = rewards.float() if not rewards.is_floating_point() else rewards
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    counts = counts.to(rewards.dtype)
    sums = torch.zeros_like(counts).index_add_(0, inverse, rewards)
    n = counts[inverse]
    mean = (sums / counts)[inverse]
    several = n > 1
    if leave_one_out:
        baseline = torch.where(several, (sums[inverse] - rewards) / (n - 1).clamp(min=1), rewards)
    else:
        baseline = mean
    advantages = torch.where(several, rewards - baseline, torch.zeros_like(rewards))
    if normalize_std:
        squares = torch.zeros_like(counts).index_add_(0, inverse, (rewards - mean) ** 2)
        std = torch.sqrt(squares[inverse] / (n - 1).clamp(min=1))
        advantages = advantages / (std + eps)
    return advantages


def group_advantages_matrix(
    rewards: torch.Tensor, *, normalize_std: bool = True, leave_one_out: bool = False, eps: float = ADVANTAGE_EPS
) -> torch.Tensor:
    """`group_advantages` for the common layout of ``G`` groups of ``N`` rollouts: ``[G, N]`` → ``[G, N]``."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [G, N], got {tuple(rewards.shape)}")
    groups, size = rewards.shape
    ids = torch.arange(groups, device=rewards.device).repeat_interleave(size)
    flat = group_advantages(rewards.reshape(-1), ids, normalize_std=normalize_std, leave_one_out=leave_one_out, eps=eps)
    return flat.reshape(groups, size)


# --------------------------------------------------------------------------------------------------
# per-token pieces of the loss


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is true (any shape; 0 when the mask is empty)."""
    total = torch.where(mask, values, torch.zeros_like(values)).sum()
    return total / mask.sum().clamp(min=1)


def clipped_policy_objective(
    ratio: torch.Tensor, advantages: torch.Tensor, *, clip_low: float, clip_high: float
) -> torch.Tensor:
    """PPO's clipped surrogate as a loss (to minimise): ``-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)``.

    Args:
        ratio: ``[B, T]`` ratio ``exp(logp - old_logp)``.
        advantages: ``[B]`` (one per sequence, broadcast over tokens) or ``[B, T]``.

    Returns:
        ``[B, T]`` per-token loss (not masked).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    return -torch.minimum(unclipped, clipped)


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KlEstimator | str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from tokens sampled from the policy (Schulman's k1/k3).

    Args:
        logprobs: ``[B, T]`` log-probabilities of the sampled tokens under the policy being trained.
        ref_logprobs: ``[B, T]`` the same tokens under the reference policy.
        estimator: ``k1``: ``logp - ref_logp`` (unbiased, can be negative, high variance);
            ``k3``: ``exp(ref_logp - logp) - (ref_logp - logp) - 1`` (unbiased, never negative, low
            variance), clamped to ``[-KL_CLAMP, KL_CLAMP]``.

    Returns:
        ``[B, T]`` per-token KL estimate (not masked).
    """
    estimator = KlEstimator(estimator)
    if estimator is KlEstimator.K1:
        return logprobs - ref_logprobs
    log_ratio = ref_logprobs - logprobs
    return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, min=-KL_CLAMP, max=KL_CLAMP)


def importance_weights(
    old_logprobs: torch.Tensor, generation_logprobs: torch.Tensor, cap: float | None
) -> torch.Tensor:
    """Truncated importance-sampling weights ``min(exp(old_logp - gen_logp), cap)``, detached.

    The batch was sampled by the generation engine, whose numerics (kernels, precision, batching) make
    its probabilities differ from the trainer's; this per-token weight re-weights the samples towards the
    trainer's distribution, truncated at ``cap`` to bound the variance (Yao et al., "Your efficient RL
    framework secretly brings you off-policy RL training"). With asynchronous GRPO the engine's weights are
    also older than the trainer's (``spec.grpo.maxOffPolicySteps``): the same weight, against the engine's
    log-probabilities, corrects for that staleness too. ``cap=None`` disables the correction (all 1).

    Args:
        old_logprobs: ``[B, T]`` the trainer's log-probabilities of the batch before the update.
        generation_logprobs: ``[B, T]`` the generation engine's log-probabilities of the same tokens.

    Returns:
        ``[B, T]`` weights, no gradient.
    """
    if cap is None:
        return torch.ones_like(old_logprobs).detach()
    return torch.clamp(torch.exp(old_logprobs.detach() - generation_logprobs.detach()), max=cap)


def aggregate_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    mode: LossAggregation | str,
    *,
    normalizer: float | None = None,
) -> torch.Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar over the tokens where ``mask`` (``[B, T]`` bool) is true.

    Modes:
        ``token``: sum over all generated tokens of the batch divided by their number (every token
            weighs the same; long sequences weigh more).
        ``sequence``: mean over sequences of each sequence's mean over its generated tokens (every
            sequence weighs the same).

    Args:
        normalizer: the denominator to use instead of this batch's own (its generated-token count for
            ``token``, its sequence count for ``sequence``). With gradient accumulation, pass the whole
            step's count: the micro-batches' losses then add up to the loss of the whole batch.
    """
    mode = LossAggregation(mode)
    masked = torch.where(mask, per_token_loss, torch.zeros_like(per_token_loss))
    if mode is LossAggregation.TOKEN:
        denominator = float(mask.sum()) if normalizer is None else normalizer
        return masked.sum() / max(denominator, 1.0)
    per_sequence = masked.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    denominator = float(mask.shape[0]) if normalizer is None else normalizer
    return per_sequence.sum() / max(denominator, 1.0)


# --------------------------------------------------------------------------------------------------
# the loss


@dataclass(frozen=True)
class LossConfig:
    """The knobs of the GRPO loss (the loss-related fields of `GrpoSpec`)."""

    clip_low: float = 0.2
    """The ratio is clipped below at ``1 - clip_low``."""
    clip_high: float = 0.28
    """The ratio is clipped above at ``1 + clip_high``."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the reference policy (0: no reference needed)."""
    kl_estimator: KlEstimator = KlEstimator.K3
    importance_sampling_cap: float | None = 2.0
    """Cap of the trainer/generator importance weight; None disables the correction."""
    aggregation: LossAggregation = LossAggregation.TOKEN

    def __post_init__(self) -> None:
        # Accept the enums' string values ("k3", "token"), as in the YAML, and store the enums.
        object.__setattr__(self, "kl_estimator", KlEstimator(self.kl_estimator))
        object.__setattr__(self, "aggregation", LossAggregation(self.aggregation))
        if self.clip_low < 0 or self.clip_high < 0 or self.kl_coef < 0:
            raise ValueError("clip_low, clip_high and kl_coef must not be negative")
        if self.importance_sampling_cap is not None and self.importance_sampling_cap <= 0:
            raise ValueError(f"importance_sampling_cap must be positive or None, got {self.importance_sampling_cap}")

    @classmethod
    def from_spec(cls, grpo: GrpoSpec) -> LossConfig:
        return cls(
            clip_low=grpo.clip_low,
            clip_high=grpo.clip_high,
            kl_coef=grpo.kl_coef,
            kl_estimator=KlEstimator(grpo.kl_estimator),
            importance_sampling_cap=grpo.importance_sampling_cap,
            aggregation=LossAggregation(grpo.loss_aggregation),
        )


@dataclass
class LossInputs:
    """Everything the loss needs about one (micro-)batch; every ``[B, T]`` tensor is aligned on targets."""

    logprobs: torch.Tensor
    """``[B, T]`` log-probabilities under the policy being trained (with gradient)."""
    old_logprobs: torch.Tensor
    """``[B, T]`` the trainer's log-probabilities before this step's update (no gradient)."""
    generation_logprobs: torch.Tensor
    """``[B, T]`` the generation engine's log-probabilities of the sampled tokens."""
    advantages: torch.Tensor
    """``[B]`` one advantage per sequence."""
    mask: torch.Tensor
    """``[B, T]`` bool, true on generated tokens."""
    ref_logprobs: torch.Tensor | None = None
    """``[B, T]`` reference-policy log-probabilities; required when ``kl_coef > 0``."""


def policy_loss(
    inputs: LossInputs, config: LossConfig, *, normalizer: float | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO loss of one (micro-)batch and its diagnostics.

    Args:
        normalizer: see `aggregate_loss` (pass the whole step's count when accumulating gradients).

    Returns:
        ``(loss, metrics)``: the scalar loss to back-propagate, and floats that are token means over
        this batch's generated tokens unless their name ends in ``_max``:
        ``loss``, ``ratio_mean``, ``ratio_max``, ``clip_frac_low`` (tokens with ``A < 0`` and the ratio
        below ``1 - clip_low``: no gradient), ``clip_frac_high`` (``A > 0`` and above ``1 + clip_high``),
        ``is_weight_mean``, ``is_weight_max``, ``is_capped_frac``, ``gen_logprob_abs_diff`` (mean
        ``|old_logp - gen_logp|``: how far the engine's numerics are from the trainer's), and ``kl``
        when a reference is given. Maxima of a batch without generated tokens are 0.
    """
    loss, statistics = policy_loss_statistics(inputs, config, normalizer=normalizer)
    return loss, statistics_to_floats(statistics)


def policy_loss_statistics(
    inputs: LossInputs, config: LossConfig, *, normalizer: float | None = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`policy_loss` with its diagnostics left as 0-dim tensors on the loss's device (maxima of no
    token are ``-inf``): nothing waits for the accelerator, so a training loop can queue the next
    micro-batch's kernels before this one's finish and read every statistic once, at the end."""
    mask = inputs.mask.bool()
    ratio = torch.exp(inputs.logprobs - inputs.old_logprobs.detach())
    advantages = inputs.advantages.detach()
    per_token = clipped_policy_objective(ratio, advantages, clip_low=config.clip_low, clip_high=config.clip_high)
    weights = importance_weights(inputs.old_logprobs, inputs.generation_logprobs, config.importance_sampling_cap)
    per_token = weights * per_token

    kl = None
    if config.kl_coef > 0:
        if inputs.ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs (the reference policy's log-probabilities)")
        kl = kl_estimate(inputs.logprobs, inputs.ref_logprobs.detach(), config.kl_estimator)
        per_token = per_token + config.kl_coef * kl
    elif inputs.ref_logprobs is not None:
        kl = kl_estimate(inputs.logprobs.detach(), inputs.ref_logprobs, config.kl_estimator)

    loss = aggregate_loss(per_token, mask, config.aggregation, normalizer=normalizer)

    with torch.no_grad():
        token_advantages = advantages.unsqueeze(-1).expand_as(ratio) if advantages.dim() == 1 else advantages
        clipped_low = (ratio < 1.0 - config.clip_low) & (token_advantages < 0)
        clipped_high = (ratio > 1.0 + config.clip_high) & (token_advantages > 0)
        capped = (
            torch.exp(inputs.old_logprobs - inputs.generation_logprobs) > config.importance_sampling_cap
            if config.importance_sampling_cap is not None
            else torch.zeros_like(mask)
        )
        statistics = {
            "loss": loss.detach(),
            "ratio_mean": masked_mean(ratio, mask),
            "ratio_max": masked_max(ratio, mask),
            "clip_frac_low": masked_mean(clipped_low.to(ratio.dtype), mask),
            "clip_frac_high": masked_mean(clipped_high.to(ratio.dtype), mask),
            "is_weight_mean": masked_mean(weights, mask),
            "is_weight_max": masked_max(weights, mask),
            "is_capped_frac": masked_mean(capped.to(ratio.dtype), mask),
            "gen_logprob_abs_diff": masked_mean((inputs.old_logprobs - inputs.generation_logprobs).abs(), mask),
        }
        if kl is not None:
            statistics["kl"] = masked_mean(kl.detach(), mask)
    return loss, statistics


def masked_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Maximum of ``values`` where ``mask`` is true, as a 0-dim tensor (``-inf`` when the mask is empty)."""
    return torch.where(mask, values.detach(), torch.full_like(values, -math.inf, dtype=values.dtype)).max()


def tensors_to_floats(tensors: dict[str, torch.Tensor]) -> dict[str, float]:
    """0-dim tensors (on one device) to floats, in one transfer from the device."""
    if not tensors:
        return {}
    values = torch.stack([value.detach().double().reshape(()) for value in tensors.values()]).tolist()
    return dict(zip(tensors, values, strict=True))


def statistics_to_floats(statistics: dict[str, torch.Tensor]) -> dict[str, float]:
    """`policy_loss_statistics`' diagnostics as floats (`tensors_to_floats`); the ``-inf`` maximum of no
    token is 0."""
    return {
        key: 0.0 if key.endswith("_max") and value == -math.inf else value
        for key, value in tensors_to_floats(statistics).items()
    }
