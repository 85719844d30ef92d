"""What a stop on notice needs, as the trainer reports it for the operator to fit the trainer pod's grace period:
the step in training finished, the checkpoint write in flight finished, the last step's checkpoint copied out of
the policy and written, and a margin; each part the slowest of the recent ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpojob_api.progress import StopReport
from grpojob_trainer.policy.checkpoint import CheckpointRequest
from grpojob_trainer.policy.checkpoint_writer import WrittenCheckpoint
from grpojob_trainer.training.checkpoints import LoopCheckpoints, StopEstimate


def written(step: int, seconds: float, size: int | None = 1000) -> WrittenCheckpoint:
    return WrittenCheckpoint(step, f"/checkpoints/step_{step:08d}", seconds, size)


def test_nothing_is_reported_before_a_checkpoint_was_written_and_a_step_trained():
    estimate = StopEstimate()
    assert estimate.report() is None
    estimate.trained(20.0)
    assert estimate.report() is None, "no checkpoint written yet"
    only_written = StopEstimate()
    only_written.written(written(10, 40.0))
    assert only_written.report() is None, "no step trained yet"


def test_a_stop_needs_a_training_phase_two_writes_and_the_copy_with_a_quarter_more_and_half_a_minute():
    estimate = StopEstimate()
    estimate.trained(20.0)
    estimate.written(written(10, 40.0, 14920384512))
    estimate.copies.append(4.0)

    # (20 + 40 + 4 + 40) * 1.25 + 30 = 160
    assert estimate.report() == StopReport(160, 40.0, 20.0, 14920384512)


def test_each_part_is_the_slowest_of_the_last_ten():
    estimate = StopEstimate()
    estimate.trained(300.0)  # a first step that compiled
    for seconds in range(10):
        estimate.trained(10.0 + seconds)
    estimate.written(written(10, 60.0))
    estimate.written(written(20, 30.0, 2000))

    report = estimate.report()
    assert report is not None
    assert (report.training_seconds, report.write_seconds) == (19.0, 60.0), "the compiling step has aged out"
    assert report.checkpoint_bytes == 2000, "the newest checkpoint's size"


class SavingPolicy:
    """The two calls `LoopCheckpoints` makes of the policy: a save that hands back the writes finished meanwhile,
    and the writes finished since."""

    def __init__(self) -> None:
        self.finished: list[WrittenCheckpoint] = []

    def save(self, request: CheckpointRequest) -> list[WrittenCheckpoint]:
        done, self.finished = self.finished, [written(request.step, 25.0, 4096)]
        return done

    def checkpoints_written(self, wait: bool = False) -> list[WrittenCheckpoint]:
        done, self.finished = self.finished, []
        return done


def test_the_loops_checkpoints_measure_what_a_stop_needs_as_they_are_written(tmp_path: Path):
    checkpoints = LoopCheckpoints(SavingPolicy(), tmp_path)  # type: ignore[arg-type]
    checkpoints.estimate.trained(8.0)
    checkpoints.start(CheckpointRequest(str(tmp_path), 10, {}, {}))
    assert checkpoints.estimate.report() is None, "the write is still in flight"

    assert checkpoints.collect(wait=True) == {"time/checkpoint_write": 25.0}

    report = checkpoints.estimate.report()
    assert report is not None and (report.write_seconds, report.training_seconds, report.checkpoint_bytes) == (
        25.0,
        8.0,
        4096,
    )
    assert report.seconds == pytest.approx((8 + 25 + 25) * 1.25 + 30, abs=1), "the copy took next to nothing"
