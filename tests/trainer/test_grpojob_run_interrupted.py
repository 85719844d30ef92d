"""`grpojob run` stopped by Ctrl-C (SIGINT to its process group, as a terminal sends it) or by SIGTERM (`kill`):
one line saying where it stopped, its checkpoint and the command that resumes, the shell's exit code for the
signal, no traceback or Ray stack dump; the same command then resumes and trains the prompts an uninterrupted
run trains."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.trainer.test_grpojob_run import finish, grpojob, write_job

STEPS = 10


@pytest.fixture(autouse=True)
def ctrl_c_heard():
    """The run hears Ctrl-C as from a terminal, however pytest was started: a shell's background job ignores SIGINT,
    its children inherit that, and `grpojob run` keeps an ignored signal ignored (as `nohup` means it)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def logged_steps(out_dir: Path) -> list[tuple[int, int, int]]:
    """(step, data epoch, data index) of each logged step: which prompts each step trained on."""
    lines = (out_dir / "metrics.jsonl").read_text().splitlines() if (out_dir / "metrics.jsonl").exists() else []
    return [(m["step"], m["data/epoch"], m["data/index"]) for m in map(json.loads, lines) if "data/index" in m]


def uninterrupted_steps(tiny_model_dir: Path, tmp: Path, steps: int) -> list[tuple[int, int, int]]:
    """`logged_steps` of a run of ``steps`` left alone, checkpointing only at its end."""
    job = write_job(tmp, tiny_model_dir, steps=steps, interval=100)
    run = grpojob("run", str(job), "--out", str(tmp / "out"), "--no-progress", cwd=tmp)
    out = finish(run, 600)
    assert run.returncode == 0, out[-3000:]
    return logged_steps(tmp / "out")


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, int, int]]:
    return uninterrupted_steps(tiny_model_dir, tmp_path_factory.mktemp("uninterrupted"), STEPS)


@pytest.mark.parametrize(
    ("signum", "to_group", "code"),
    [(signal.SIGINT, True, 130), (signal.SIGTERM, False, 143)],
    ids=["ctrl-c", "sigterm"],
)
def test_an_interrupted_run_says_where_it_stopped_and_the_same_command_resumes_it(
    tiny_model_dir: Path, tmp_path: Path, uninterrupted, signum: int, to_group: bool, code: int
):
    job = write_job(tmp_path, tiny_model_dir, steps=STEPS, interval=100)  # no checkpoint but the interruption's
    command = ("run", str(job), "--out", str(tmp_path / "out"), "--no-progress")
    first = grpojob(*command, cwd=tmp_path)
    deadline = time.monotonic() + 300
    while len(logged_steps(tmp_path / "out")) < 2:
        assert first.poll() is None, first.communicate()[0][-3000:]
        if time.monotonic() > deadline:
            os.killpg(first.pid, signal.SIGKILL)
            pytest.fail(f"no step after 300s:\n{first.communicate()[0][-3000:]}")
        time.sleep(0.2)
    (os.killpg if to_group else os.kill)(first.pid, signum)
    out = finish(first, 120)

    assert first.returncode == code, out[-3000:]
    said = [line for line in out.splitlines() if line.startswith("grpojob: ")]
    assert len(said) == 1 and said[0].startswith("grpojob: interrupted at step "), out[-3000:]
    for dump in ("Traceback", "received at time", "logging.cc", "KeyboardInterrupt"):
        assert dump not in out, out[-3000:]
    stopped = logged_steps(tmp_path / "out")
    step = stopped[-1][0]
    checkpoint = tmp_path / "checkpoints" / f"step_{step:08d}"
    assert said[0] == (
        f"grpojob: interrupted at step {step}; checkpoint {checkpoint}; resume with: grpojob {' '.join(command)}"
    )
    assert (checkpoint / "meta.json").is_file(), "the last completed step is checkpointed"
    assert step < STEPS

    again = grpojob(*command, cwd=tmp_path)
    out = finish(again, 600)
    assert again.returncode == 0, out[-3000:]
    assert f"resumed from the checkpoint of step {step}" in out
    assert logged_steps(tmp_path / "out") == uninterrupted, "every step once, on the prompts of a run left alone"
