"""Checkpoints written beside the training: `CheckpointWriter` writes one snapshot at a time on a thread of its own.

The policy's rank 0 owns one (`grpojob_trainer.policy.worker.PolicyWorker`). A save copies the state out of the
policy (`snapshot_checkpoint`, which the training waits for) and hands the snapshot to the writer, whose thread
writes and publishes it (`write_checkpoint`) while the next steps train. At most one write is in flight: a new one
waits for the one before. Whoever needs the checkpoint on disk (the run's end, a stop, an export of a checkpoint)
waits for it with `finished`, which also hands over what each write took, and raises the error of a write that
failed (once).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from grpojob_trainer.policy.checkpoint import CheckpointSnapshot, checkpoint_bytes, write_checkpoint


@dataclass(frozen=True)
class WrittenCheckpoint:
    """A checkpoint written and published: of which step, where, the seconds its write took and its size."""

    step: int
    path: str
    seconds: float
    bytes: int | None
    """None: the size could not be read."""


class CheckpointWriter:
    """Writes checkpoint snapshots on a background thread, one at a time."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._written: list[WrittenCheckpoint] = []
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    def start(self, snapshot: CheckpointSnapshot) -> None:
        """Write ``snapshot`` in the background, once the write in flight (if any) has finished; raises that write's
        error instead, if it failed."""
        self.wait()
        self._raise_failure()
        self._thread = threading.Thread(
            target=self._write, args=(snapshot,), name=f"checkpoint-step-{snapshot.step}", daemon=True
        )
        self._thread.start()

    def wait(self) -> None:
        """Return once no write is in flight."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def finished(self, wait: bool = False) -> list[WrittenCheckpoint]:
        """The writes finished since the last call, oldest first (``wait``: after waiting for the one in flight);
        raises the error of a write that failed, once."""
        if wait:
            self.wait()
        self._raise_failure()
        with self._lock:
            written, self._written = self._written, []
        return written

    def _raise_failure(self) -> None:
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def _write(self, snapshot: CheckpointSnapshot) -> None:
        started = time.perf_counter()
        try:
            path = write_checkpoint(snapshot)
        except BaseException as error:  # handed to whoever waits next
            with self._lock:
                self._error = error
            return
        seconds = time.perf_counter() - started
        written = WrittenCheckpoint(snapshot.step, str(path), seconds, checkpoint_bytes(path))
        with self._lock:
            self._written.append(written)
