"""`grpojob run` whose policy rank or generation engine dies mid-step (its Ray worker process killed, as the
kernel's OOM killer or a crash would): the run ends within seconds, not at a timeout, with one line naming the
worker, the step, what happened and the command that resumes; an engine's loss leaves the policy's last completed
step checkpointed, a rank's leaves the newest checkpoint there was. The same command then resumes from that
checkpoint and trains the prompts an uninterrupted run trains."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.trainer.test_grpojob_run import finish, grpojob, process_tree, write_job
from tests.trainer.test_grpojob_run_interrupted import logged_steps, uninterrupted_steps

STEPS = 8
INTERVAL = 3


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, int, int]]:
    return uninterrupted_steps(tiny_model_dir, tmp_path_factory.mktemp("uninterrupted"), STEPS)


def worker_process(root: int, title: str) -> int | None:
    """The Ray worker process of ``root``'s run whose title (Ray's ``ray::Class.method``) starts with ``title``."""
    return next((pid for pid, command in process_tree(root).items() if command.startswith(title)), None)


@pytest.mark.parametrize(
    ("worker", "title", "still_saved"),
    [
        ("policy", "ray::PolicyWorker.train_step", False),  # killed while it trains: its state is gone
        ("generation", "ray::GenerationWorker", True),  # killed while it serves rollouts: the policy is intact
    ],
    ids=["policy-rank", "generation-engine"],
)
def test_a_worker_killed_mid_step_ends_the_run_at_once_and_the_same_command_resumes_from_the_checkpoint(
    tiny_model_dir: Path, tmp_path: Path, uninterrupted, worker: str, title: str, still_saved: bool
):
    job = write_job(tmp_path, tiny_model_dir, steps=STEPS, interval=INTERVAL)
    command = ("run", str(job), "--out", str(tmp_path / "out"), "--no-progress")
    first = grpojob(*command, cwd=tmp_path)
    deadline = time.monotonic() + 300
    victim = None
    while victim is None:
        assert first.poll() is None, first.communicate()[0][-3000:]
        if time.monotonic() > deadline:
            os.killpg(first.pid, signal.SIGKILL)
            pytest.fail(f"no {title} after step {INTERVAL + 1} within 300s:\n{first.communicate()[0][-3000:]}")
        if len(logged_steps(tmp_path / "out")) >= INTERVAL + 1:
            victim = worker_process(first.pid, title)
        time.sleep(0.05)
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    out = finish(first, 120)
    ended_after = time.monotonic() - killed

    assert first.returncode == 1, out[-3000:]
    assert ended_after < 30, f"the run took {ended_after:.0f}s to notice"
    said = [line for line in out.splitlines() if line.startswith("grpojob: ")]
    assert len(said) == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    completed = logged_steps(tmp_path / "out")[-1][0]
    saved = completed if still_saved else INTERVAL * (completed // INTERVAL)
    checkpoint = tmp_path / "checkpoints" / f"step_{saved:08d}"
    resume = f"resume from checkpoint {checkpoint} with: grpojob {' '.join(command)}"
    assert re.fullmatch(
        rf"grpojob: a {worker} worker died at step {completed + 1} \(host \S+, node [0-9.]+: its process died "
        rf"\(The actor is dead because its worker process has died\..*\)\); {re.escape(resume)}",
        said[0],
    ), said[0]
    assert (checkpoint / "meta.json").is_file()

    again = grpojob(*command, cwd=tmp_path)
    out = finish(again, 600)
    assert again.returncode == 0, out[-3000:]
    assert f"resumed from the checkpoint of step {saved}" in out
    resumed = {step: prompts for step, *prompts in logged_steps(tmp_path / "out")}  # a step's last record wins
    assert [(step, *resumed[step]) for step in sorted(resumed)] == uninterrupted, (
        "every step trained, on the prompts of a run left alone"
    )
