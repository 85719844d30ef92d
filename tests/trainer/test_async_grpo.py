"""Asynchronous GRPO (`spec.grpo.maxOffPolicySteps`) with `grpojob run` on the CPU: the rollouts of the next
steps are generated while a step trains, never while weights change, no sample is staler than the bound,
and a trainer killed with rollouts drawn ahead resumes on exactly the prompts an uninterrupted run trains.

Overlap is read from the loop's recorded timeline (``timeline/*`` metrics: seconds on one clock), never
from how long anything took."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from grpojob_trainer.policy.checkpoint import list_checkpoints
from grpojob_trainer.training.data import PromptDataset

from .test_grpojob_run import finish, grpojob, write_job


def async_job(tmp: Path, model: Path, *, steps: int, interval: int, ahead: int, lora: dict | None = None) -> Path:
    path = write_job(tmp, model, steps=steps, interval=interval)
    job = yaml.safe_load(path.read_text())
    job["spec"]["grpo"]["maxOffPolicySteps"] = ahead
    if lora is not None:
        job["spec"]["training"]["lora"] = lora
    path.write_text(yaml.safe_dump(job))
    return path


def records(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def expected_positions(data: Path, job: Path, steps: int) -> list[tuple[int, int]]:
    """The dataset position after each step's prompts in an uninterrupted run: its batches in order."""
    grpo = yaml.safe_load(job.read_text())["spec"]["grpo"]
    dataset = PromptDataset.from_jsonl(data, seed=grpo.get("seed", 0))
    positions = []
    for _ in range(steps):
        dataset.next_batch(grpo["promptsPerStep"])
        positions.append((dataset.position.epoch, dataset.position.index))
    return positions


@pytest.mark.parametrize("lora", [None, {"rank": 8}], ids=["full", "lora"])
def test_the_next_steps_rollouts_run_while_a_step_trains_and_never_while_weights_change(
    tiny_model_dir: Path, tmp_path: Path, lora: dict | None
):
    """Also with a LoRA policy, whose pushes carry its adapter alone."""
    ahead, steps = 2, 6
    job = async_job(tmp_path, tiny_model_dir, steps=steps, interval=100, ahead=ahead, lora=lora)
    process = grpojob("run", str(job), "--out", str(tmp_path / "out"), "--no-progress", cwd=tmp_path)
    out = finish(process, 600)
    assert process.returncode == 0, out[-3000:]
    assert ("of the adapter" in out) == (lora is not None), out[-3000:]
    by_step = {r["step"]: r for r in records(tmp_path / "out")}
    assert sorted(by_step) == list(range(1, steps + 1))

    for step in range(1, steps - ahead + 1):  # step + ahead's rollouts are launched as step begins
        trained, ahead_of_it = by_step[step], by_step[step + ahead]
        assert ahead_of_it["timeline/rollouts_started"] < trained["timeline/training_finished"], (
            f"the rollouts of step {step + ahead} started only after step {step} trained"
        )
        assert ahead_of_it["timeline/rollouts_finished"] > trained["timeline/training_started"], (
            f"the rollouts of step {step + ahead} were done before step {step} began training"
        )
    for push in by_step.values():
        for rollouts in by_step.values():
            assert not (
                rollouts["timeline/rollouts_started"] < push["timeline/weight_sync_finished"]
                and push["timeline/weight_sync_started"] < rollouts["timeline/rollouts_finished"]
            ), f"weights of step {push['step']} pushed while the rollouts of step {rollouts['step']} ran"

    staleness = [by_step[s]["rollout/staleness/max"] for s in range(1, steps + 1)]
    assert staleness == [min(s - 1, ahead) for s in range(1, steps + 1)], staleness
    assert all(by_step[s]["rollout/staleness/mean"] == by_step[s]["rollout/staleness/max"] for s in by_step)
    assert all(r["is_weight_mean"] > 0 for r in by_step.values())


def test_a_trainer_killed_with_rollouts_drawn_ahead_resumes_on_the_prompts_of_an_uninterrupted_run(
    tiny_model_dir: Path, tmp_path: Path
):
    ahead, steps, interval = 2, 7, 3
    job = async_job(tmp_path, tiny_model_dir, steps=steps, interval=interval, ahead=ahead)
    first = grpojob("run", str(job), "--out", str(tmp_path / "out"), "--no-progress", cwd=tmp_path)
    deadline = time.monotonic() + 300
    while not any(step >= interval for step, _ in list_checkpoints(tmp_path / "checkpoints")):
        assert first.poll() is None, first.communicate()[0][-3000:]
        if time.monotonic() > deadline:
            os.killpg(first.pid, signal.SIGKILL)
            pytest.fail(f"no checkpoint of step {interval} after 300s:\n{first.communicate()[0][-3000:]}")
        time.sleep(0.5)
    os.killpg(first.pid, signal.SIGKILL)  # the prompts of the next `ahead` steps are already drawn
    first.communicate()
    saved = max(step for step, _ in list_checkpoints(tmp_path / "checkpoints"))
    assert saved < steps
    expected = expected_positions(tmp_path / "train.jsonl", job, steps)
    checkpoint = json.loads((dict(list_checkpoints(tmp_path / "checkpoints"))[saved] / "meta.json").read_text())
    assert (checkpoint["data_position"]["epoch"], checkpoint["data_position"]["index"]) == expected[saved - 1], (
        "the checkpoint holds the position after the prompts drawn ahead, not after those it trained"
    )

    second = grpojob("run", str(job), "--out", str(tmp_path / "out"), "--no-progress", cwd=tmp_path)
    out = finish(second, 600)
    assert second.returncode == 0, out[-3000:]
    assert f"resumed from the checkpoint of step {saved}" in out

    trained = {r["step"]: (r["data/epoch"], r["data/index"]) for r in records(tmp_path / "out")}  # last wins
    assert [trained[s] for s in range(1, steps + 1)] == expected, "the resumed run lost or repeated prompts"
