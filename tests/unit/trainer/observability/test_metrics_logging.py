"""Metrics: JSONL and TensorBoard logging (non-scalars skipped), the sinks, the Prometheus endpoint, the log
line of a step, step timer, progress publishing."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from grpojob_trainer.net.loopback import free_port
from grpojob_trainer.observability.metrics import (
    FileProgressPublisher,
    MetricsLogger,
    StepTimer,
    read_jsonl,
    step_line,
    tokens_per_second,
)
from grpojob_trainer.observability.prometheus import PrometheusMetrics


def test_scalars_go_to_jsonl_and_tensorboard_and_other_values_are_skipped(tmp_path: Path):
    with MetricsLogger(tmp_path) as logger:
        logged = logger.log(
            1,
            {
                "loss": 0.5,
                "tokens": 128,
                "truncated": True,
                "phase": "train",
                "per_sample_rewards": [1.0, 0.0],
                "tensor": torch.tensor(3.0),
                "nested": {"a": 1},
                "missing": None,
            },
        )
        logger.log(2, {"loss": 0.25, "tokens": 130})
    assert logged == {"loss": 0.5, "tokens": 128, "truncated": True, "phase": "train"}
    assert read_jsonl(tmp_path / "metrics.jsonl") == [
        {"step": 1, "loss": 0.5, "tokens": 128, "truncated": True, "phase": "train"},
        {"step": 2, "loss": 0.25, "tokens": 130},
    ]
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"loss", "tokens", "truncated"}
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 0.5), (2, 0.25)]
    assert [e.value for e in events.Scalars("truncated")] == [1.0]


def test_a_reopened_logger_appends(tmp_path: Path):
    for step in (1, 2):
        with MetricsLogger(tmp_path, tensorboard=False) as logger:
            logger.log(step, {"reward": float(step)})
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]


class FakeClock:
    """A clock that moves only when told: ``advance(seconds)``."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_step_timer_accumulates_seconds_per_phase():
    clock = FakeClock()
    timer = StepTimer(clock)
    with timer.phase("generation"):
        clock.advance(2.0)
    clock.advance(50.0)  # between phases: not counted
    with timer.phase("training"):
        clock.advance(1.0)
    with timer.phase("generation"):
        clock.advance(0.5)
    assert timer.metrics() == {"time/generation": 2.5, "time/training": 1.0, "time/step": 3.5}
    assert timer.metrics(prefix="t.") == {"t.generation": 2.5, "t.training": 1.0, "t.step": 3.5}


def test_a_phase_that_raises_is_still_timed():
    clock = FakeClock()
    timer = StepTimer(clock)
    with pytest.raises(RuntimeError), timer.phase("weight_sync"):
        clock.advance(0.25)
        raise RuntimeError("boom")
    assert timer.seconds == {"weight_sync": 0.25}


def test_tokens_per_second():
    assert tokens_per_second(1000, 2.0) == 500.0
    assert tokens_per_second(1000, 0.0) == 0.0


def test_progress_is_written_as_step_and_mean_reward_json(tmp_path: Path):
    publisher = FileProgressPublisher(tmp_path / "status" / "progress.json")
    assert publisher.read() is None
    publisher.publish(3, 0.25)
    publisher.publish(4, 0.5)
    assert json.loads((tmp_path / "status" / "progress.json").read_text()) == {"step": 4, "meanReward": 0.5}
    assert [p.name for p in (tmp_path / "status").iterdir()] == ["progress.json"]  # no temporary files left
    publisher.publish(5, float("nan"))
    assert publisher.read() == {"step": 5, "meanReward": None}


def test_local_progress_keeps_what_a_stop_needs_once_measured(tmp_path: Path):
    from grpojob_api.progress import StopReport

    publisher = FileProgressPublisher(tmp_path / "progress.json")
    publisher.publish(10, 0.5, StopReport(160, 40.0, 20.0, 14920384512))
    publisher.publish(11, 0.5)  # nothing newly measured: the last measure stands
    assert publisher.read() == {
        "step": 11,
        "meanReward": 0.5,
        "stop": {
            "seconds": 160,
            "checkpointWriteSeconds": 40.0,
            "trainingSeconds": 20.0,
            "checkpointBytes": 14920384512,
        },
    }


STEP_METRICS = {
    "rollout/reward/mean": 0.4125,
    "rollout/count": 64.0,
    "rollout/failed": 2.0,
    "rollout/groups": 8.0,
    "rollout/groups_with_varied_reward": 5.0,
    "time/step": 12.34,
    "time/generation": 8.1,
    "time/training": 3.02,
    "time/weight_sync": 0.4,
    "throughput/generated_tokens_per_s": 1834.2,
    "weight_sync/seconds": 0.38,
}


def test_the_log_line_of_a_step_has_its_reward_time_phases_failed_rollouts_and_groups_that_teach():
    assert step_line(3, 16, STEP_METRICS) == (
        "step 3/16 reward 0.4125 time 12.3s (generation 8.1s, training 3.0s, weight_sync 0.4s) "
        "failed rollouts 2/64 groups with varied rewards 5/8 generated 1.83e+03 tokens/s"
    )
    # A step that wrote its checkpoint shows the checkpoint's own time.
    assert "weight_sync 0.4s, checkpoint 2.5s) " in step_line(3, 16, {**STEP_METRICS, "time/checkpoint": 2.5})
    # A step whose every rollout failed has no reward.
    assert (
        step_line(4, 16, {"rollout/count": 64.0, "rollout/failed": 64.0}) == "step 4/16 reward - failed rollouts 64/64"
    )


class RecordingSink:
    def __init__(self) -> None:
        self.steps: list[tuple[int, dict]] = []
        self.closed: bool | None = None

    def log(self, step: int, metrics) -> None:
        self.steps.append((step, dict(metrics)))

    def close(self, failed: bool = False) -> None:
        self.closed = failed


def test_sinks_get_the_logged_scalars_and_hear_whether_training_failed(tmp_path: Path):
    finished, failed = RecordingSink(), RecordingSink()
    with MetricsLogger(tmp_path / "a", tensorboard=False, sinks=[finished]) as logger:
        logger.log(1, {"loss": 0.5, "per_sample": [1.0]})
    assert finished.steps == [(1, {"loss": 0.5})] and finished.closed is False
    with pytest.raises(RuntimeError), MetricsLogger(tmp_path / "b", tensorboard=False, sinks=[failed]):
        raise RuntimeError("rollouts failed")
    assert failed.closed is True


def served_exporter() -> tuple[PrometheusMetrics, int]:
    """The job "demo"'s Prometheus exporter (16 steps), serving on a free loopback port."""
    exporter = PrometheusMetrics("demo", max_steps=16)
    port = free_port()
    exporter.serve(port, address="127.0.0.1")
    return exporter, port


def scraped(port: int) -> dict[str, float]:
    """Every sample the exporter on ``port`` serves, by its name and labels."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line[:1] != "#"}


def test_the_prometheus_endpoint_serves_the_last_step(tmp_path: Path):
    exporter, port = served_exporter()
    with MetricsLogger(tmp_path, tensorboard=False, sinks=[exporter]) as logger:
        logger.log(2, STEP_METRICS)
        logger.log(3, STEP_METRICS | {"rollout/reward/mean": 0.5})
    samples = scraped(port)
    assert samples['grpojob_trainer_step{grpojob="demo"}'] == 3
    assert samples['grpojob_trainer_max_steps{grpojob="demo"}'] == 16
    assert samples['grpojob_trainer_mean_reward{grpojob="demo"}'] == 0.5
    assert samples['grpojob_trainer_step_seconds{grpojob="demo"}'] == 12.34
    assert samples['grpojob_trainer_phase_seconds{grpojob="demo",phase="generation"}'] == 8.1
    assert samples['grpojob_trainer_generated_tokens_per_second{grpojob="demo"}'] == 1834.2
    assert samples['grpojob_trainer_weight_sync_seconds{grpojob="demo"}'] == 0.38
    assert samples['grpojob_trainer_rollouts_total{grpojob="demo"}'] == 128
    assert samples['grpojob_trainer_failed_rollouts_total{grpojob="demo"}'] == 4


def test_the_prometheus_endpoint_serves_the_last_evaluation_and_tensorboard_and_jsonl_keep_every_one(tmp_path: Path):
    exporter, port = served_exporter()
    evaluation = {"eval/reward/mean": 0.25, "eval/pass@4": 0.5, "eval/rows": 8.0, "eval/failed": 1.0}
    with MetricsLogger(tmp_path, tensorboard=True, sinks=[exporter]) as logger:
        logger.log(0, evaluation | {"eval/seconds": 3.0})  # the baseline, before training
        logger.log(2, STEP_METRICS | evaluation | {"eval/reward/mean": 0.75, "eval/seconds": 2.5})
        logger.log(3, STEP_METRICS)  # no evaluation: the gauges keep the last one
    samples = scraped(port)
    assert samples['grpojob_trainer_eval_step{grpojob="demo"}'] == 2
    assert samples['grpojob_trainer_eval_mean_reward{grpojob="demo"}'] == 0.75
    assert samples['grpojob_trainer_eval_pass_rate{grpojob="demo",k="4"}'] == 0.5
    assert samples['grpojob_trainer_eval_failed_rollouts{grpojob="demo"}'] == 1
    assert samples['grpojob_trainer_eval_seconds{grpojob="demo"}'] == 2.5

    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("eval/reward/mean")) for r in records] == [(0, 0.25), (2, 0.75), (3, None)]
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("eval/reward/mean")] == [(0, 0.25), (2, 0.75)]
