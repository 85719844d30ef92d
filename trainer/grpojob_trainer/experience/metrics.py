"""Per-sample rollout metrics, each summarised as mean/max/min/median/std, and the batch's timing."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from grpojob_trainer.algorithm.samples import TrainingSample

STATISTICS = ("mean", "max", "min", "median", "std")


def summarize(values: Sequence[float]) -> dict[str, float]:
    """mean, max, min, median and population std of ``values`` (all NaN-free; empty → {})."""
    if not values:
        return {}
    return {
        "mean": statistics.fmean(values),
        "max": float(max(values)),
        "min": float(min(values)),
        "median": float(statistics.median(values)),
        "std": statistics.pstdev(values),
    }


def per_sample_values(samples: Sequence[TrainingSample]) -> dict[str, list[float]]:
    """The per-sample quantities that `rollout_metrics` summarises."""
    return {
        "turns": [float(s.turns) for s in samples],
        "total_tokens": [float(len(s.token_ids)) for s in samples],
        "generated_tokens": [float(s.generated_tokens) for s in samples],
        "reward": [s.reward for s in samples],
        "natural_termination": [0.0 if s.truncated else 1.0 for s in samples],
        "truncation": [1.0 if s.truncated else 0.0 for s in samples],
    }


def rollout_metrics(samples: Sequence[TrainingSample], failed: int, prefix: str = "rollout/") -> dict[str, float]:
    """Flat metrics: ``rollout/<quantity>/<statistic>`` for each quantity, plus counts of (failed) rollouts.

    ``natural_termination`` and ``truncation`` are 0/1 per sample, so their mean is the rate.
    ``groups_with_varied_reward`` counts the groups (rollouts of one row) whose rewards are not all equal: only
    those have non-zero advantages, so only they teach the policy anything (TRL's `frac_reward_zero_std` is
    the rest).
    """
    total = len(samples) + failed
    metrics: dict[str, float] = {
        f"{prefix}count": float(total),
        f"{prefix}failed": float(failed),
        f"{prefix}failure_rate": failed / total if total else 0.0,
    }
    for quantity, values in per_sample_values(samples).items():
        for statistic, value in summarize(values).items():
            metrics[f"{prefix}{quantity}/{statistic}"] = value
    if samples:
        rewards_by_group: dict[int, set[float]] = {}
        for sample in samples:
            rewards_by_group.setdefault(sample.group_index, set()).add(sample.reward)
        metrics[f"{prefix}groups"] = float(len(rewards_by_group))
        metrics[f"{prefix}groups_with_varied_reward"] = float(sum(len(r) > 1 for r in rewards_by_group.values()))
    return metrics


def reward_part_metrics(samples: Sequence[TrainingSample]) -> dict[str, float]:
    """``reward/<name>/mean`` of each named part of the reward (a reward function's own reward, as TRL logs it),
    over the samples it applies to."""
    values: dict[str, list[float]] = {}
    for sample in samples:
        for name, value in sample.reward_parts:
            values.setdefault(name, []).append(value)
    return {f"reward/{name}/mean": statistics.fmean(found) for name, found in values.items()}


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values`` by linear interpolation between the nearest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be within [0, 100], got {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def timing_metrics(spans: Sequence[tuple[float, float]], prefix: str = "rollout/") -> dict[str, float]:
    """From each successful rollout's (sent, finished) seconds after the batch began:
    ``rollout/seconds/<statistic>`` (each rollout's own time, as the driver saw it), ``rollout/seconds/p90``,
    and ``rollout/tail_s``: seconds from the 90th-percentile rollout finishing to the last one (the batch
    waits that long for its slowest tenth). Empty → {}."""
    if not spans:
        return {}
    durations = [finished - sent for sent, finished in spans]
    finished = [end for _, end in spans]
    metrics = {f"{prefix}seconds/{statistic}": value for statistic, value in summarize(durations).items()}
    metrics[f"{prefix}seconds/p90"] = percentile(durations, 90)
    metrics[f"{prefix}tail_s"] = max(finished) - percentile(finished, 90)
    return metrics


def staleness_metrics(samples: list[TrainingSample], policy_version: int) -> dict[str, float]:
    """``rollout/staleness/{mean,max}``: how many updates behind ``policy_version`` (the policy about to
    train on them) the samples' generating policies are."""
    behind = [policy_version - sample.policy_version for sample in samples]
    return {"rollout/staleness/mean": sum(behind) / len(behind), "rollout/staleness/max": float(max(behind))}


def throughput_metrics(
    samples: list[TrainingSample], step_seconds: float, generation_seconds: float
) -> dict[str, float]:
    """The step's time and its tokens per second: generated (over the generation's time) and all (over the step's)."""
    generated = sum(s.generated_tokens for s in samples)
    return {
        "time/step": step_seconds,
        "time/generation": generation_seconds,
        "throughput/generated_tokens_per_s": generated / max(generation_seconds, 1e-9),
        "throughput/tokens_per_s": sum(len(s.token_ids) for s in samples) / step_seconds,
    }
