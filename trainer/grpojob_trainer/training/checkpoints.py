"""The loop's checkpoints: started at the steps that write one, written in the background by the policy's rank 0
(`grpojob_trainer.policy.checkpoint_writer`) while the next steps train, and counted as written only once on disk.

A step that saves waits for the write before it (at most one is in flight) and for its state to be copied out of
the policy: that is its ``time/checkpoint``. The write's own seconds are logged, as ``time/checkpoint_write``, with
the metrics of the step during which it finished. The run's end, a stop and an export of a checkpoint wait for the
write in flight before they name the checkpoint.

`StopEstimate` turns what the run measured (its checkpoints' writes, their copies out of the policy, its training
phases) into what a stop on notice needs, which the trainer reports with its progress (`grpojob_api.progress`):
the operator fits the trainer pod's grace period to it.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from pathlib import Path

from grpojob_api.progress import StopReport
from grpojob_trainer.observability.metrics import CHECKPOINT_WRITE_SECONDS
from grpojob_trainer.policy.checkpoint import CheckpointRequest, checkpoint_path
from grpojob_trainer.policy.checkpoint_writer import WrittenCheckpoint
from grpojob_trainer.policy.group import PolicyGroup

log = logging.getLogger(__name__)


RECENT_MEASURES = 10
"""How many of the latest writes, copies and training phases the estimate takes the slowest of."""
STOP_MARGIN = 1.25
"""The estimate's margin over the sum of its parts: a quarter more, for a slower write than any seen so far."""
STOP_MARGIN_SECONDS = 30
"""And these seconds more, for what the parts leave out: the stop's own bookkeeping and the process's exit."""


class StopEstimate:
    """The seconds a stop on notice needs, from the run's recent measures: the training of the step in flight
    (finished, not abandoned), the write of the checkpoint in flight, then the last step's checkpoint copied out of
    the policy and written. Each part is the slowest of the last `RECENT_MEASURES` seen, so a slow first step
    weighs only until ten more have run."""

    def __init__(self) -> None:
        self.writes: deque[float] = deque(maxlen=RECENT_MEASURES)
        self.copies: deque[float] = deque(maxlen=RECENT_MEASURES)
        self.trainings: deque[float] = deque(maxlen=RECENT_MEASURES)
        self.checkpoint_bytes: int | None = None
        """The newest checkpoint's size."""

    def trained(self, seconds: float) -> None:
        self.trainings.append(seconds)

    def written(self, written: WrittenCheckpoint) -> None:
        self.writes.append(written.seconds)
        self.checkpoint_bytes = written.bytes

    def report(self) -> StopReport | None:
        """What a stop needs, once a checkpoint's write and a training phase were measured (None before)."""
        if not self.writes or not self.trainings:
            return None
        write, training, copy = max(self.writes), max(self.trainings), max(self.copies, default=0.0)
        seconds = math.ceil(STOP_MARGIN * (training + write + copy + write) + STOP_MARGIN_SECONDS)
        return StopReport(seconds, write, training, self.checkpoint_bytes)


class LoopCheckpoints:
    """The checkpoints one run of the loop writes to ``directory``: which is in flight, which was written last."""

    def __init__(self, policy: PolicyGroup, directory: Path) -> None:
        self.policy, self.directory = policy, directory
        self.in_flight: int | None = None
        """The step whose checkpoint is being written (None: none)."""
        self.last_written: int | None = None
        """The step of the newest checkpoint on disk that this run wrote or resumed from."""
        self.estimate = StopEstimate()

    def resumed(self, step: int) -> None:
        self.last_written = step

    def path(self, step: int) -> Path | None:
        """The checkpoint of ``step``, if it is on disk."""
        return checkpoint_path(self.directory, step) if step == self.last_written else None

    def newest(self) -> Path | None:
        """The newest checkpoint this run wrote or resumed from (None: none)."""
        return None if self.last_written is None else checkpoint_path(self.directory, self.last_written)

    def start(self, request: CheckpointRequest) -> dict[str, float]:
        """Start ``request``'s write once the one in flight has finished: returns once the state is copied out of
        the policy, with the finished write's metrics."""
        started = time.perf_counter()
        metrics = self._written(self.policy.save(request))
        self.estimate.copies.append(time.perf_counter() - started)  # with what it waited for the write before
        self.in_flight = request.step
        return metrics

    def collect(self, wait: bool = False) -> dict[str, float]:
        """The write in flight's ``time/checkpoint_write`` if it has finished (``wait``: once it has); raises its
        error if it failed."""
        if self.in_flight is None:
            return {}
        return self._written(self.policy.checkpoints_written(wait))

    def _written(self, finished: list[WrittenCheckpoint]) -> dict[str, float]:
        metrics = {}
        for written in finished:
            log.info("checkpoint of step %d written in %.1fs: %s", written.step, written.seconds, written.path)
            self.last_written, self.in_flight = written.step, None
            self.estimate.written(written)
            metrics[CHECKPOINT_WRITE_SECONDS] = written.seconds
        return metrics

    def finish_after_error(self) -> None:
        """When an error ends the run: let the write in flight finish (a retried run resumes from it); a failure to
        write it is logged, the first error stays the one raised."""
        step = self.in_flight
        try:
            self.collect(wait=True)
        except Exception as error:  # the policy's ranks may be what failed
            log.warning("the checkpoint of step %s may not have been written: %s", step, error)
