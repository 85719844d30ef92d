"""The loop's checkpoints: started at the steps that write one, written in the background by the policy's rank 0
(`grpojob_trainer.policy.checkpoint_writer`) while the next steps train, and counted as written only once on disk.

A step that saves waits for the write before it (at most one is in flight) and for its state to be copied out of
the policy: that is its ``time/checkpoint``. The write's own seconds are logged, as ``time/checkpoint_write``, with
the metrics of the step during which it finished. The run's end, a stop and an export of a checkpoint wait for the
write in flight before they name the checkpoint.
"""

from __future__ import annotations

import logging
from pathlib import Path

from grpojob_trainer.observability.metrics import CHECKPOINT_WRITE_SECONDS
from grpojob_trainer.policy.checkpoint import CheckpointRequest, checkpoint_path
from grpojob_trainer.policy.checkpoint_writer import WrittenCheckpoint
from grpojob_trainer.policy.group import PolicyGroup

log = logging.getLogger(__name__)


class LoopCheckpoints:
    """The checkpoints one run of the loop writes to ``directory``: which is in flight, which was written last."""

    def __init__(self, policy: PolicyGroup, directory: Path) -> None:
        self.policy, self.directory = policy, directory
        self.in_flight: int | None = None
        """The step whose checkpoint is being written (None: none)."""
        self.last_written: int | None = None
        """The step of the newest checkpoint on disk that this run wrote or resumed from."""

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
        metrics = self._written(self.policy.save(request))
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
