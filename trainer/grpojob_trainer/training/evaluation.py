"""Evaluation on held-out rows (`spec.evaluation`): when it is due, what it reports, which one is best.

An evaluation sends each of its rows ``k`` times through the job's environments and engines and keeps
only rewards: its rollouts never become training samples. Its metrics, logged at the step whose policy it
evaluated (0 for the baseline before training):

- ``eval/reward/mean``: the mean reward of the rollouts that finished (failed ones are counted apart, as
  ``rollout/reward/mean`` does for training);
- ``eval/pass@k``: the share of rows with at least one of their ``k`` rollouts at or above the pass
  threshold (for ``k`` samples of ``k``, the unbiased pass@k estimator is exactly that); a row whose
  rollouts all failed did not pass;
- ``eval/<environment>/reward/mean`` for each environment the rows went to;
- ``eval/rows``, ``eval/rollouts``, ``eval/failed`` and ``eval/seconds``.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from grpojob_api import v1alpha1 as api
from grpojob_api.progress import EvaluationReport
from grpojob_trainer.experience.rollouts import EnvironmentURLs, PolicySampling, collect_rollouts
from grpojob_trainer.nemo_gym.protocol import Row

REWARD = "eval/reward/mean"
EVALUATION_KEY = "evaluation"
"""Where a checkpoint's loop position keeps the evaluation history (beside the dataset's position: epoch and
index, or a mixture's batches and sources)."""


def evaluation_due(step: int, every_steps: int, max_steps: int) -> bool:
    """Whether the policy of ``step`` (after its update) is evaluated: every ``every_steps`` and the last."""
    return step % every_steps == 0 or step == max_steps


def pass_key(k: int) -> str:
    """The pass@k metric's name: ``eval/pass@<k>``."""
    return f"eval/pass@{k}"


@dataclass(frozen=True)
class EvaluationRollout:
    """What an evaluation keeps of one rollout: its row, its environment and its reward (None: it failed)."""

    row: int
    environment: str
    reward: float | None


def evaluation_metrics(
    rollouts: Sequence[EvaluationRollout], k: int, pass_threshold: float, seconds: float
) -> dict[str, float]:
    """The metrics of one evaluation (see the module's docstring); ``eval/reward/mean`` is NaN when every
    rollout failed."""
    by_row: dict[int, list[float]] = defaultdict(list)
    by_environment: dict[str, list[float]] = defaultdict(list)
    rows = {r.row for r in rollouts}
    rewards: list[float] = []
    for rollout in rollouts:
        if rollout.reward is not None:
            rewards.append(rollout.reward)
            by_row[rollout.row].append(rollout.reward)
            by_environment[rollout.environment].append(rollout.reward)
    passed = sum(any(reward >= pass_threshold for reward in by_row[row]) for row in rows)
    metrics = {
        REWARD: _mean(rewards),
        pass_key(k): passed / len(rows) if rows else math.nan,
        "eval/rows": float(len(rows)),
        "eval/rollouts": float(len(rollouts)),
        "eval/failed": float(len(rollouts) - len(rewards)),
        "eval/seconds": seconds,
    }
    for environment, rewards in sorted(by_environment.items()):
        metrics[f"eval/{environment}/reward/mean"] = _mean(rewards)
    return metrics


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@dataclass(frozen=True)
class Evaluated:
    """One evaluation's result: the step whose policy it evaluated and its mean reward."""

    step: int
    mean_reward: float

    def report(self) -> EvaluationReport:
        """As the trainer's progress reports it."""
        return EvaluationReport(self.step, self.mean_reward)


@dataclass
class EvaluationHistory:
    """The newest evaluation and the best so far: the trained policy (step >= 1) with the highest mean
    reward, the earliest of equals. The baseline (step 0, the model the job started from) is never the best
    (there is no checkpoint of it to export), nor is an evaluation whose rollouts all failed (NaN)."""

    last: Evaluated | None = None
    best: Evaluated | None = None

    def record(self, step: int, mean_reward: float) -> bool:
        """Note an evaluation; True when it is the new best."""
        self.last = Evaluated(step, mean_reward)
        if step < 1 or math.isnan(mean_reward) or (self.best is not None and mean_reward <= self.best.mean_reward):
            return False
        self.best = self.last
        return True

    def as_dict(self) -> dict[str, list[float] | None]:
        """For a checkpoint: ``{"last": [step, reward], "best": [step, reward]}``."""
        return {
            "last": [self.last.step, self.last.mean_reward] if self.last else None,
            "best": [self.best.step, self.best.mean_reward] if self.best else None,
        }

    @classmethod
    def from_dict(cls, saved: dict | None) -> EvaluationHistory:
        """The history a checkpoint stored (empty when it stored none)."""
        saved = saved or {}

        def read(key: str) -> Evaluated | None:
            value = saved.get(key)
            return Evaluated(int(value[0]), float(value[1])) if value else None

        return cls(read("last"), read("best"))


def evaluation_line(step: int, metrics: dict[str, float], k: int) -> str:
    """The log line of one evaluation: ``evaluation of step 10: reward 0.52 pass@1 0.50 on 32 rows, 0 of
    32 rollouts failed, 3.1s``."""
    reward, passed = metrics.get(REWARD, math.nan), metrics.get(pass_key(k), math.nan)
    return (
        f"evaluation of step {step}: reward {reward:.4g} pass@{k} {passed:.3g} on {int(metrics['eval/rows'])} rows, "
        f"{int(metrics['eval/failed'])} of {int(metrics['eval/rollouts'])} rollouts failed, "
        f"{metrics['eval/seconds']:.1f}s"
    )


@dataclass
class Evaluator:
    """Runs the evaluations of one job: its rows, each ``k`` times, through the job's environments with the
    evaluation's sampling (marked, so the generation servers accept it), keeping only the rewards: the
    samples are dropped here and never reach the policy."""

    rows: Sequence[Row]
    spec: api.EvaluationSpec
    sampling: PolicySampling
    environment_urls: EnvironmentURLs
    grpo: api.GrpoSpec
    generation_url: str | None = None
    history: EvaluationHistory = field(default_factory=EvaluationHistory)

    @classmethod
    def for_job(
        cls,
        spec: api.GRPOJobSpec,
        rows: Sequence[Row],
        token: str | None,
        environment_urls: EnvironmentURLs,
        generation_url: str | None,
    ) -> Evaluator:
        """The evaluator of ``spec.evaluation`` over ``rows``, its rollouts marked with ``token`` (the secret the
        engines accept as an evaluation's mark)."""
        evaluation = spec.evaluation
        assert evaluation is not None
        max_new_tokens = spec.evaluation_max_new_tokens
        sampling = PolicySampling(evaluation.temperature, evaluation.top_p, max_new_tokens, evaluation_token=token)
        return cls(rows, evaluation, sampling, environment_urls, spec.grpo, generation_url)

    async def run(self, step: int) -> dict[str, float]:
        """Evaluate the policy the engines serve now (that of ``step``); its metrics, also noted in ``history``."""
        k = self.spec.k
        repeated = [row for row in self.rows for _ in range(k)]
        groups = [index for index in range(len(self.rows)) for _ in range(k)]
        began = time.perf_counter()
        batch = await collect_rollouts(
            repeated,
            self.environment_urls,
            concurrency=self.grpo.rollout_concurrency,
            timeout_s=self.grpo.rollout_timeout_seconds,
            retries=self.grpo.rollout_retries,
            deadline_s=self.grpo.rollout_deadline_seconds,
            group_indices=groups,
            sampling=self.sampling,
            generation_url=self.generation_url,
        )
        rollouts = [
            EvaluationRollout(groups[o.row_index], o.env_name, o.sample.reward if o.sample is not None else None)
            for o in batch.outcomes
        ]
        metrics = evaluation_metrics(rollouts, k, self.spec.pass_threshold, time.perf_counter() - began)
        self.history.record(step, metrics[REWARD])
        return metrics
