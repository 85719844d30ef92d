"""The trainer's per-step metrics in Prometheus' text format, on `/metrics` (a `MetricSink`).

    grpojob_trainer_step{grpojob="demo"} 12                    last finished step
    grpojob_trainer_max_steps{grpojob="demo"} 100
    grpojob_trainer_mean_reward{grpojob="demo"} 0.41           of the last step with rollouts
    grpojob_trainer_step_seconds{grpojob="demo"} 9.8
    grpojob_trainer_phase_seconds{grpojob="demo",phase="generation"} 6.1    (rollout_wait, prepare, training,
                                                                             weight_sync)
    grpojob_trainer_generated_tokens_per_second{grpojob="demo"} 1830
    grpojob_trainer_weight_sync_seconds{grpojob="demo"} 0.4
    grpojob_trainer_rollouts_total{grpojob="demo"} 768          counters since the trainer started
    grpojob_trainer_failed_rollouts_total{grpojob="demo"} 3
    grpojob_trainer_eval_step{grpojob="demo"} 10               the last evaluation (spec.evaluation)
    grpojob_trainer_eval_mean_reward{grpojob="demo"} 0.52
    grpojob_trainer_eval_pass_rate{grpojob="demo",k="1"} 0.5   eval/pass@k
    grpojob_trainer_eval_failed_rollouts{grpojob="demo"} 0
    grpojob_trainer_eval_seconds{grpojob="demo"} 3.1

Each attempt's trainer starts from zero (Prometheus takes a counter reset in its stride). The label is
`grpojob`, not `job`, which Prometheus keeps for the scrape job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from grpojob_trainer.observability.metrics import (
    EVALUATION_FAILED,
    EVALUATION_PASS_PREFIX,
    EVALUATION_REWARD,
    EVALUATION_ROWS,
    EVALUATION_SECONDS,
    FAILED_ROLLOUTS,
    GENERATED_TOKENS_PER_S,
    GENERATION,
    PREPARE,
    REWARD,
    ROLLOUT_WAIT,
    ROLLOUTS,
    STEP_SECONDS,
    TRAINING,
    WEIGHT_SYNC,
    WEIGHT_SYNC_SECONDS,
    Scalar,
)

PREFIX = "grpojob_trainer"
PHASES = (GENERATION, ROLLOUT_WAIT, PREPARE, TRAINING, WEIGHT_SYNC)


class PrometheusMetrics:
    """Gauges and counters of the last step, in a registry of their own (`serve` publishes it)."""

    def __init__(self, job_name: str, max_steps: int, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        labels = {"grpojob": job_name}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"{PREFIX}_{name}", doc, list(labels), registry=self.registry).labels(**labels)

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"{PREFIX}_{name}", doc, list(labels), registry=self.registry).labels(**labels)

        def gauge_by(label: str, name: str, doc: str) -> Gauge:
            """A gauge with one more label than the job's, set per value of ``label``."""
            return Gauge(f"{PREFIX}_{name}", doc, [*labels, label], registry=self.registry)

        self.step = gauge("step", "Last finished training step.")
        gauge("max_steps", "Steps the job trains (spec.grpo.maxSteps).").set(max_steps)
        self.mean_reward = gauge("mean_reward", "Mean reward of the rollouts of the last step that had any.")
        self.step_seconds = gauge("step_seconds", "Wall time of the last step.")
        self.phase_seconds = gauge_by("phase", "phase_seconds", "Seconds of each phase of the last step.")
        self.job_name = job_name
        self.generated_tokens_per_second = gauge(
            "generated_tokens_per_second", "Tokens generated per second of the last step's generation phase."
        )
        self.weight_sync_seconds = gauge(
            "weight_sync_seconds", "Seconds the last weight sync took, as the trainer saw it."
        )
        self.rollouts = counter("rollouts", "Rollouts run, failed ones included.")
        self.failed_rollouts = counter("failed_rollouts", "Rollouts that failed (environment or generation errors).")
        self.eval_step = gauge("eval_step", "Step whose policy the last evaluation evaluated (0: before training).")
        self.eval_mean_reward = gauge("eval_mean_reward", "Mean reward of the last evaluation's rollouts.")
        self.eval_pass_rate = gauge_by(
            "k",
            "eval_pass_rate",
            "Share of the last evaluation's rows with a passing rollout among their k (eval/pass@k).",
        )
        self.eval_failed_rollouts = gauge("eval_failed_rollouts", "Rollouts of the last evaluation that failed.")
        self.eval_seconds = gauge("eval_seconds", "Seconds the last evaluation took.")

    def log(self, step: int, metrics: Mapping[str, Scalar]) -> None:
        """Take one step's metrics (a `MetricSink`)."""
        self.step.set(step)
        _set(self.mean_reward, metrics.get(REWARD))
        _set(self.step_seconds, metrics.get(STEP_SECONDS))
        _set(self.generated_tokens_per_second, metrics.get(GENERATED_TOKENS_PER_S))
        _set(self.weight_sync_seconds, metrics.get(WEIGHT_SYNC_SECONDS))
        for phase in PHASES:
            _set(self.phase_seconds.labels(grpojob=self.job_name, phase=phase), metrics.get(f"time/{phase}"))
        for counter, key in ((self.rollouts, ROLLOUTS), (self.failed_rollouts, FAILED_ROLLOUTS)):
            value = metrics.get(key)
            if isinstance(value, int | float) and value > 0:
                counter.inc(value)
        if EVALUATION_ROWS in metrics:
            self._log_evaluation(step, metrics)

    def _log_evaluation(self, step: int, metrics: Mapping[str, Scalar]) -> None:
        self.eval_step.set(step)
        _set(self.eval_mean_reward, metrics.get(EVALUATION_REWARD))
        _set(self.eval_failed_rollouts, metrics.get(EVALUATION_FAILED))
        _set(self.eval_seconds, metrics.get(EVALUATION_SECONDS))
        for key, value in metrics.items():
            if key.startswith(EVALUATION_PASS_PREFIX):
                k = key.removeprefix(EVALUATION_PASS_PREFIX)
                _set(self.eval_pass_rate.labels(grpojob=self.job_name, k=k), value)

    def close(self, failed: bool = False) -> None:
        """Nothing to flush: the endpoint serves the last values until the process ends."""

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        """Serve `/metrics` on ``port`` from a daemon thread."""
        start_http_server(port, addr=address, registry=self.registry)


def _set(gauge: Any, value: Any) -> None:
    """Set a gauge to a finite number; leave it as it was otherwise (a step without rollouts has no reward)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        gauge.set(value)
