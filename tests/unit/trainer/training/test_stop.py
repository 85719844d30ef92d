"""A run's stop request, with real signals sent to this process."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from grpojob_trainer.training.stop import Interrupted, StopRequest


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
