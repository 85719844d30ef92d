"""Stopping a run on notice: SIGINT (Ctrl-C) or SIGTERM (`kill`, a pod's eviction, a node drain, a preemption).

The first signal asks the loop to stop. A step still collecting its rollouts is abandoned (the policy has not
changed yet, and a resumed run draws its prompts again); a step already training is finished (an update cannot
be taken back), without waiting for the next steps' rollouts, pushing its weights or evaluating them. The loop
then writes a checkpoint of its last completed step unless it has one and raises `Interrupted`, which the
command reports in one line and turns into the exit code a shell expects of the signal (130, 143).

Outside the loop (loading the model, starting the environments, the final export) there is no step to finish:
the signal raises `Interrupted` where the command is, and the command's clean-up runs as it does on an error. A
second signal while the first is handled ends the process at once.

The handlers replace Ray's: after `ray.init` a SIGTERM would reach Ray's C++ failure handler, which prints a
stack dump before Python's handler exits.

A lost Ray worker (`grpojob_trainer.cluster.workers.WorkerWatch`: its pod deleted, its node reclaimed, its
process crashed) stops the run the same way, from the watch's thread, and so does a call to a worker that
raised its death (`lost_in_call`). The last completed step is checkpointed only while the policy's ranks are
intact and waiting on none of the dead worker's calls (an engine lost while rollouts ran or the policy
trained); otherwise the newest checkpoint on disk is where the next run resumes. `WorkerLost` says which
worker, where it ran and whether its node left the cluster (a preemption) or its process died on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator
from pathlib import Path
from types import FrameType
from typing import TypeVar

from grpojob_api.progress import preemption_message, worker_lost_message
from grpojob_trainer.cluster.workers import LostWorker, WorkerWatch

T = TypeVar("T")

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_code(signum: int) -> int:
    """What a shell reports for a process ended by ``signum``: 128 + its number (130 for SIGINT, 143 for
    SIGTERM)."""
    return 128 + signum


class Interrupted(BaseException):
    """The run stopped on a signal, after writing what it could. A `BaseException`, as `KeyboardInterrupt` is: the
    signal's handler raises it wherever the main thread is, and a library's ``except Exception`` (a retry loop, a
    best-effort call) must not swallow it."""

    def __init__(self, signum: int, step: int | None = None, checkpoint: Path | None = None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.step = step
        """The last completed step (None: none yet)."""
        self.checkpoint = checkpoint
        """The checkpoint of ``step``, or the newest one there is (None: none)."""

    @property
    def exit_code(self) -> int:
        return exit_code(self.signum)

    def where(self) -> str:
        """ "at step N; checkpoint PATH", or what stands for either when there is none."""
        at = "before the first step" if self.step is None else f"at step {self.step}"
        saved = f"checkpoint {self.checkpoint}" if self.checkpoint is not None else "no checkpoint yet"
        return f"{at}; {saved}"


class WorkerLost(Exception):
    """The run stopped because a Ray worker was lost, after writing what it could."""

    def __init__(self, lost: LostWorker, step: int | None = None, checkpoint: Path | None = None) -> None:
        super().__init__(f"the {lost.name.role} worker {lost.name.index} was lost")
        self.lost = lost
        self.step = step
        """The last completed step (None: none yet)."""
        self.checkpoint = checkpoint
        """The newest checkpoint there is, which the next run resumes from (None: none)."""

    def reason(self, command: str | None = None) -> str:
        """One line: which worker, at which step, where it ran and what happened; then where the trainer pod's
        retry resumes or, given the ``command`` that ran on this machine, how to resume it."""
        if command is None:
            then = "the retry starts from the first step (no checkpoint yet)"
            if self.checkpoint is not None:
                then = f"the retry resumes from checkpoint {self.checkpoint}"
        elif self.checkpoint is not None:
            then = f"resume from checkpoint {self.checkpoint} with: {command}"
        else:
            then = f"no checkpoint yet; start again with: {command}"
        detail = f"{self.lost.where()}: {self.lost.what_happened()}"
        return worker_lost_message(self.lost.name.role, (self.step or 0) + 1, detail, self.lost.node_gone, then)


def trainer_pod_line(stopped: Interrupted | WorkerLost) -> str:
    """The trainer pod's one line on an early stop: its termination message, and its report to the operator
    (`grpojob_api.progress.StoppedReport`). SIGTERM is the notice of a preemption, an eviction or a drain."""
    if isinstance(stopped, WorkerLost):
        return stopped.reason()
    if stopped.signum == signal.SIGTERM:
        return preemption_message(stopped.where())
    return f"stopped by {signal.Signals(stopped.signum).name} {stopped.where()}"


class StopRequest:
    """The signal that asks the run to stop, once one came. ``install`` it before the work starts; the loop
    watches it (``watching``) and asks it at its safe points."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.lost: LostWorker | None = None
        """The first Ray worker lost, once one is."""
        self.lost_in_a_call = False
        """Whether a call to a worker raised its death (the policy may have been inside that call)."""
        self.worker_watch: WorkerWatch | None = None
        """The `WorkerWatch` that reports to this request (`grpojob_trainer.training.placement.watch_workers`)."""
        self._lost_seen = threading.Event()
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None or self.lost is not None

    @property
    def name(self) -> str:
        if self.signum is not None:
            return signal.Signals(self.signum).name
        if self.lost is not None:
            return f"the loss of the {self.lost.name.role} worker {self.lost.name.index}"
        return "nothing"

    @property
    def may_save(self) -> bool:
        """Whether the last completed step may still be checkpointed: the policy's ranks all alive, and none of
        them inside a call that involved the lost worker."""
        return self.lost is None or (not self.lost.policy and not self.lost_in_a_call)

    def worker_lost(self, lost: LostWorker) -> None:
        """The watch's word (from its thread): ``lost`` is gone; wake the loop as a signal does."""
        if self.lost is None:
            self.lost = lost
        self._lost_seen.set()
        loop, event = self._loop, self._event
        if loop is not None and event is not None:
            with contextlib.suppress(RuntimeError):  # the loop has just closed: it asks `requested` anyway
                loop.call_soon_threadsafe(event.set)

    def lost_in_call(self, error: BaseException, timeout_s: float = 90.0) -> None:
        """A call to a worker raised its death (``error``): wait, at most ``timeout_s``, for the watch to say
        which worker and whether its node went; without its word, the error's."""
        self.lost_in_a_call = True
        if self.signum is not None:  # stopping on a signal already: its grace period is not ours to spend
            timeout_s = 0
        if not self._lost_seen.wait(timeout_s if self.worker_watch is not None else 0) and self.lost is None:
            self.lost = LostWorker.from_error(error)

    def confirm_workers(self, timeout_s: float = 90.0, poll_s: float = 0.2) -> bool:
        """Whether every watched worker answers a call made from now on within ``timeout_s`` (True without a
        watch). Asked before blaming a failure on what the workers serve: a lost engine fails every rollout at
        once (its server refuses connections), while Ray may take a minute to declare it lost. Returns early on
        a stop, and waits on while the watch decides what a failed call means (up to its ``node_grace_s``)."""
        watch = self.worker_watch
        if watch is None:
            return True
        since = time.monotonic()
        while not self.requested:
            if watch.answered_since(since):
                return True
            if time.monotonic() - since >= timeout_s + (watch.node_grace_s if watch.deciding else 0):
                return False
            time.sleep(poll_s)
        return False

    def ended(self, step: int | None, checkpoint: Path | None) -> Interrupted | WorkerLost:
        """What the run raises once it stopped after ``step`` (None: none), its newest checkpoint ``checkpoint``."""
        if self.signum is None and self.lost is not None:
            return WorkerLost(self.lost, step, checkpoint)
        return Interrupted(self.signum or signal.SIGTERM, step, checkpoint)

    @contextlib.contextmanager
    def installed(self, signals: Iterable[int] = SIGNALS) -> Iterator[StopRequest]:
        """Handle ``signals`` (one ignored when this process started, as `nohup` leaves SIGINT, stays ignored)
        until the block ends, then restore the handlers there were."""
        previous = {}
        for signum in signals:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                previous[signum] = signal.signal(signum, self._outside_the_loop)
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def reinstall(self) -> None:
        """Take the signals back from a library that set its own handlers (``ray.init`` sets SIGTERM's)."""
        for signum in SIGNALS:
            if signal.getsignal(signum) not in (signal.SIG_IGN, self._outside_the_loop):
                signal.signal(signum, self._outside_the_loop)

    def _outside_the_loop(self, signum: int, frame: FrameType | None) -> None:
        self._second(signum)
        self.signum = signum
        raise Interrupted(signum)

    def _in_the_loop(self, signum: int) -> None:
        self._second(signum)
        self.signum = signum
        if self._event is not None:
            self._event.set()

    def _second(self, signum: int) -> None:
        """A second signal while the first is handled: stop now, writing nothing more."""
        if self.signum is None:
            return
        print(f"grpojob: {signal.Signals(signum).name} again: stopping now", file=sys.stderr, flush=True)
        os._exit(exit_code(signum))

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[StopRequest]:
        """While the loop runs, a signal only records the request (asyncio's handlers wake the loop however
        busy Ray's threads keep the process); the loop asks at its safe points."""
        loop = asyncio.get_running_loop()
        self._event, self._loop = asyncio.Event(), loop
        if self.requested:
            self._event.set()
        handled = [signum for signum in SIGNALS if signal.getsignal(signum) == self._outside_the_loop]
        for signum in handled:
            loop.add_signal_handler(signum, self._in_the_loop, signum)
        try:
            yield self
        finally:
            for signum in handled:
                loop.remove_signal_handler(signum)
                signal.signal(signum, self._outside_the_loop)
            self._event, self._loop = None, None

    async def watch(self, work: Awaitable[T]) -> T:
        """Await ``work`` (the loop) while watching: ``asyncio.run(stop.watch(run_loop(...)))``."""
        async with self.watching():
            return await work

    async def finished(self, awaitable: Awaitable[object]) -> bool:
        """Wait for ``awaitable`` or a stop, whichever comes first; whether ``awaitable`` finished (a task left
        unfinished is the caller's to cancel)."""
        future = asyncio.ensure_future(awaitable)
        if self._event is None:
            await asyncio.wait({future})
            return True
        stopped = asyncio.ensure_future(self._event.wait())
        try:
            await asyncio.wait({future, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        return future.done()
