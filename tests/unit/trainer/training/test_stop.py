"""A run's stop request, with real signals sent to this process, and a lost Ray worker's word from another thread."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from grpojob_api.progress import is_worker_lost
from grpojob_trainer.cluster.workers import LostWorker, Place, WorkerName, WorkerWatch
from grpojob_trainer.training.stop import Interrupted, StopRequest, WorkerLost


@pytest.fixture
def ctrl_c_heard():
    """SIGINT handled as in a terminal, however pytest was started (a shell's background job ignores it, and the
    stop request keeps an ignored signal ignored, as `nohup` means it)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_signal_outside_the_loop_interrupts_where_the_command_is_and_the_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)

    with pytest.raises(Interrupted) as raised, StopRequest().installed():
        os.kill(os.getpid(), signal.SIGTERM)

    assert raised.value.exit_code == 143 and raised.value.where() == "before the first step; no checkpoint yet"
    assert signal.getsignal(signal.SIGTERM) is before


def test_in_the_loop_a_signal_ends_the_wait_it_interrupts_and_nothing_else(ctrl_c_heard):
    async def loop(stop: StopRequest) -> tuple[bool, bool]:
        quick = await stop.finished(asyncio.sleep(0))
        asyncio.get_running_loop().call_later(0.01, os.kill, os.getpid(), signal.SIGINT)
        slow = await stop.finished(asyncio.sleep(60))
        return quick, slow

    with StopRequest().installed() as stop:
        quick, slow = asyncio.run(stop.watch(loop(stop)))

    assert (quick, slow) == (True, False)
    assert stop.requested and stop.name == "SIGINT"


def test_the_line_names_the_step_and_its_checkpoint():
    interrupted = Interrupted(signal.SIGINT, 7, Path("ckpt/step_00000007"))

    assert interrupted.exit_code == 130
    assert interrupted.where() == "at step 7; checkpoint ckpt/step_00000007"


NODE = Place("node-2", "10.244.0.12", "tiny-policy-worker-x7k2p", in_a_pod=True)


def test_a_worker_lost_from_another_thread_ends_the_wait_it_interrupts():
    lost = LostWorker(WorkerName("generation", 0), NODE, node_gone=True, cause="")

    async def loop(stop: StopRequest) -> bool:
        asyncio.get_running_loop().call_later(
            0.01, lambda: threading.Thread(target=stop.worker_lost, args=(lost,)).start()
        )
        return await stop.finished(asyncio.sleep(60))

    stop = StopRequest()
    started = time.monotonic()
    assert asyncio.run(stop.watch(loop(stop))) is False
    assert time.monotonic() - started < 5
    assert stop.requested and stop.lost == lost and stop.name == "the loss of the generation worker 0"
    assert stop.may_save, "an engine lost between calls leaves the policy's state to checkpoint"


def test_after_a_call_raised_a_workers_death_nothing_more_is_read_from_the_policy():
    engine_in_a_call, rank = StopRequest(), StopRequest()
    engine_in_a_call.worker_lost(LostWorker(WorkerName("generation", 0), NODE, True, ""))
    engine_in_a_call.lost_in_call(RuntimeError("The actor died"))
    rank.worker_lost(LostWorker(WorkerName("policy", 1), NODE, True, ""))

    assert not engine_in_a_call.may_save, "the policy may have been inside the call with the dead engine"
    assert not rank.may_save, "a rank's state is gone with it"


def test_a_call_that_raised_a_death_the_watch_never_names_waits_a_bounded_time():
    stop = StopRequest()
    stop.worker_watch = WorkerWatch({}, stop.worker_lost)
    started = time.monotonic()
    stop.lost_in_call(RuntimeError("The actor died unexpectedly.\nThe actor is dead because its node has died."), 0.2)

    assert 0.2 <= time.monotonic() - started < 5
    assert stop.lost is not None and stop.lost.cause == "The actor is dead because its node has died."
    assert isinstance(stop.ended(3, None), WorkerLost)


def test_a_lost_workers_line_says_which_where_what_happened_and_where_the_run_resumes():
    checkpoint = Path("/checkpoints/tiny/step_00000006")
    gone = WorkerLost(LostWorker(WorkerName("policy", 0), NODE, node_gone=True, cause=""), 7, checkpoint)
    crashed = WorkerLost(LostWorker(WorkerName("generation", 1), NODE, False, "The actor is dead because …"), 7, None)

    assert gone.reason() == (
        "a policy worker was lost at step 8 (pod tiny-policy-worker-x7k2p, node 10.244.0.12: its node left the Ray "
        "cluster); the retry resumes from checkpoint /checkpoints/tiny/step_00000006"
    )
    assert is_worker_lost(f"Error: {gone.reason()}"), "the operator retries it as a preemption"
    assert crashed.reason("grpojob run job.yaml") == (
        "a generation worker died at step 8 (pod tiny-policy-worker-x7k2p, node 10.244.0.12: its process died (The "
        "actor is dead because …)); no checkpoint yet; start again with: grpojob run job.yaml"
    )
    assert not is_worker_lost(crashed.reason()), "a crash counts against spec.backoffLimit"
