"""What `grpojob run` shows: a progress bar only on a terminal (not with --verbose or --no-progress); with the bar,
log lines are written above it and the per-step lines go to the run's log file only; without it, every line."""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from grpojob_trainer.observability.console import bar_postfix, wants_bar


@pytest.fixture
def terminal():
    """Both ends of a real pseudo-terminal, 100 columns wide."""
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    yield leader, follower
    for fd in (leader, follower):
        os.close(fd)


def test_the_bar_is_drawn_on_a_terminal_only(terminal, tmp_path: Path):
    _, follower = terminal
    with open(follower, "w", closefd=False) as tty:
        assert wants_bar(tty)
        assert not wants_bar(tty, verbose=True)
        assert not wants_bar(tty, no_progress=True)
    read, write = os.pipe()
    with open(write, "w") as pipe:
        assert not wants_bar(pipe)
    os.close(read)
    with open(tmp_path / "log", "w") as file:
        assert not wants_bar(file)


def test_the_bar_carries_the_reward_and_the_step_time():
    assert bar_postfix({"rollout/reward/mean": 0.41249, "time/step": 12.34}) == "reward 0.412 last step 12.3s"
    assert bar_postfix({"rollout/reward/mean": float("nan")}) == ""


SCRIPT = """
import logging, sys
from pathlib import Path
from grpojob_trainer.observability.console import LOG_FORMAT, StepDisplay, wants_bar
logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
loop = logging.getLogger("grpojob_trainer.training.loop")
with StepDisplay("tiny", 3, Path(sys.argv[1]), bar=wants_bar(sys.stderr)) as display:
    for step in (1, 2, 3):
        loop.info("step %d/3 reward 0.%d time 1.0s", step, step)
        logging.getLogger("grpojob_trainer.nemo_gym").warning("a warning at step %d", step)
        display.on_step(step, {"rollout/reward/mean": step / 10, "time/step": 1.0})
    loop.info("exported the model of step 3 to DIR")
print("summary", flush=True)
"""


def run_script(log_file: Path, stderr: int) -> str:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(log_file)], stdout=subprocess.PIPE, stderr=stderr, timeout=120
    )
    assert result.returncode == 0
    return result.stdout.decode()


def read_all(fd: int) -> str:
    chunks = []
    os.set_blocking(fd, False)
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


def test_on_a_terminal_log_lines_go_above_the_bar_and_the_steps_to_the_log_file(terminal, tmp_path: Path):
    leader, follower = terminal
    assert run_script(tmp_path / "run.log", stderr=follower) == "summary\n"
    screen = read_all(leader)

    assert "3/3" in screen and "reward 0.300 last step 1.0s" in screen, screen
    assert "step 1/3 reward" not in screen, "the per-step lines stay off the screen"
    # A warning is written on a line of its own above the bar: the bar is cleared first, redrawn after.
    warning = next(line for line in screen.splitlines() if "a warning at step 2" in line)
    assert "%|" not in warning, screen
    assert "exported the model of step 3" in screen
    logged = (tmp_path / "run.log").read_text()
    assert [f"step {step}/3 reward" in logged for step in (1, 2, 3)] == [True] * 3
    assert "a warning at step 3" in logged and "%|" not in logged


def test_elsewhere_one_line_a_step_and_no_bar(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "run.log")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    steps = [line for line in result.stderr.splitlines() if "grpojob_trainer.training.loop: step " in line]
    assert len(steps) == 3, result.stderr
    assert "%|" not in result.stderr and "\r" not in result.stderr
    assert result.stdout == "summary\n"
    assert (tmp_path / "run.log").read_text().count("training.loop: step ") == 3
