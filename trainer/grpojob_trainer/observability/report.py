"""The end-of-run report of `grpojob run`: a reward-curve PNG from metrics.jsonl (the evaluations' rewards
beside training's) and summary lines."""

from __future__ import annotations

import math
from pathlib import Path

from grpojob_trainer.observability.metrics import read_jsonl

REWARD_KEY = "rollout/reward/mean"
EVALUATION_REWARD_KEY = "eval/reward/mean"


def reward_curve(metrics_file: Path, key: str = REWARD_KEY) -> list[tuple[int, float]]:
    """(step, value of ``key``) of every logged step that has a finite one: training's mean reward, or with
    ``EVALUATION_REWARD_KEY`` the evaluations' (step 0: before training)."""
    curve = []
    for record in read_jsonl(metrics_file):
        reward = record.get(key)
        if isinstance(reward, int | float) and math.isfinite(reward):
            curve.append((int(record["step"]), float(reward)))
    return curve


def plot_reward_curve(
    curve: list[tuple[int, float]], out: Path, title: str, evaluations: list[tuple[int, float]] | None = None
) -> Path:
    """Write the reward curve (and its 5-step moving average) as a PNG, with the evaluations' mean rewards
    on held-out rows beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [s for s, _ in curve]
    rewards = [r for _, r in curve]
    window = 5
    smooth = [
        sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1])
        for i in range(len(rewards))
    ]
    figure, axes = plt.subplots(figsize=(7, 4))
    axes.plot(steps, rewards, marker="o", markersize=3, linewidth=1, alpha=0.5, label="mean reward")
    axes.plot(steps, smooth, linewidth=2, label=f"{window}-step moving average")
    if evaluations:
        axes.plot(
            [s for s, _ in evaluations],
            [r for _, r in evaluations],
            marker="s",
            linewidth=2,
            label="evaluation (held-out rows)",
        )
    axes.set_xlabel("step")
    axes.set_ylabel("mean reward")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out


def evaluation_summary(evaluations: list[tuple[int, float]]) -> str:
    """ "evaluation reward a (step 0) → b (step N), best c at step s" (the best among trained steps)."""
    if not evaluations:
        return "no evaluation produced a reward"
    (first_step, first), (last_step, last) = evaluations[0], evaluations[-1]
    text = f"evaluation reward {first:.3f} (step {first_step}) → {last:.3f} (step {last_step})"
    trained = [(reward, -step) for step, reward in evaluations if step >= 1]
    if trained:
        reward, step = max(trained)
        text += f", best {reward:.3f} at step {-step}"
    return text


def summary(curve: list[tuple[int, float]], window: int = 5) -> str:
    """ "mean reward a → b (first/last `window` steps)"."""
    if not curve:
        return "no step produced a reward"
    rewards = [r for _, r in curve]
    first = sum(rewards[:window]) / len(rewards[:window])
    last = sum(rewards[-window:]) / len(rewards[-window:])
    return f"mean reward {first:.3f} over the first {min(window, len(rewards))} steps → {last:.3f} over the last"
