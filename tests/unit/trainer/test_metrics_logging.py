"""Metrics: JSONL and TensorBoard logging (non-scalars skipped), step timer, progress publishing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from grpojob_trainer.metrics import FileProgressPublisher, MetricsLogger, StepTimer, read_jsonl, tokens_per_second


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
