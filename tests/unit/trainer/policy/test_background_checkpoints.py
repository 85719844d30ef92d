"""A policy rank writes its checkpoints in the background while it trains on: the checkpoint holds the policy as it
was when saved, a write that fails is reported, and a write killed midway leaves no checkpoint that looks complete,
so the run resumes from the one before."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import pytest
import safetensors.torch
import torch

from grpojob_api.v1alpha1 import GRPOJobSpec
from grpojob_trainer.models.tiny import write_tiny_model
from grpojob_trainer.policy.checkpoint import (
    CheckpointRequest,
    checkpoint_path,
    latest_checkpoint,
    snapshot_checkpoint,
)
from grpojob_trainer.policy.checkpoint_writer import CheckpointWriter
from grpojob_trainer.policy.config import RankConfig
from grpojob_trainer.policy.worker import PolicyWorker

from .test_fsdp_policy import step_samples
from .test_model_export import SPEC


@pytest.fixture(scope="module")
def base_model(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("base") / "tiny")


def started_policy(model_dir: Path) -> PolicyWorker:
    worker = PolicyWorker(RankConfig(GRPOJobSpec.model_validate(SPEC), str(model_dir), seed=0))
    worker.start("127.0.0.1", 0)
    return worker


def parameters(worker: PolicyWorker) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in worker.learner.model.named_parameters()}


def test_the_policy_trains_on_while_its_checkpoint_is_written_and_the_checkpoint_holds_it_as_saved(
    base_model: Path, tmp_path: Path
):
    worker = started_policy(base_model)
    worker.train_step(step_samples())
    saved = parameters(worker)

    assert worker.save(CheckpointRequest(str(tmp_path), 1, {"index": 8}, {})) == [], "no write before it"
    for _ in range(2):  # while the write may still run
        worker.train_step(step_samples())
    written = worker.checkpoints_written(wait=True)

    path = str(checkpoint_path(tmp_path, 1))
    assert [(w.step, w.path) for w in written] == [(1, path)] and written[0].seconds > 0
    on_disk = sum(file.stat().st_size for file in Path(path).iterdir())
    assert written[0].bytes == on_disk, "its size, which tells what a stop's write needs"
    assert worker.checkpoints_written(wait=True) == [], "each write is reported once"
    assert any(not torch.equal(saved[name], p) for name, p in parameters(worker).items()), "the policy trained on"
    resumed = started_policy(base_model)
    assert resumed.resume(str(tmp_path)) == (1, {"index": 8})
    for name, tensor in parameters(resumed).items():
        assert torch.equal(tensor, saved[name]), name
    optimizer = torch.load(Path(path) / "optimizer.pt", weights_only=True)
    assert {float(state["step"]) for state in optimizer["state"].values()} == {1.0}, "the optimizer as it was saved"


def test_a_failed_write_is_reported_once_and_leaves_no_checkpoint(base_model: Path, tmp_path: Path):
    worker = started_policy(base_model)
    (tmp_path / "claim").write_text("not a directory")
    worker.save(CheckpointRequest(str(tmp_path / "claim" / "checkpoints"), 1, {}, {}))

    with pytest.raises(OSError):
        worker.checkpoints_written(wait=True)
    worker.save(CheckpointRequest(str(tmp_path / "checkpoints"), 2, {}, {}))
    worker.train_step(step_samples())
    assert [w.step for w in worker.save(CheckpointRequest(str(tmp_path / "checkpoints"), 3, {}, {}))] == [2], (
        "a save waits for the write before it and reports it"
    )
    assert [w.step for w in worker.checkpoints_written(wait=True)] == [3]


class KillsTheProcess:
    """Pickled into a checkpoint's optimizer file, it kills the writing process with SIGKILL midway through it."""

    def __reduce__(self):
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("not killed")


def write_then_die_writing(model_dir: str, directory: str) -> None:
    """A trainer that writes the checkpoint of step 1, trains on and is killed while writing that of step 2."""
    worker = started_policy(Path(model_dir))
    worker.train_step(step_samples())
    worker.save(CheckpointRequest(directory, 1, {"index": 8}, {}))
    worker.checkpoints_written(wait=True)
    worker.train_step(step_samples())
    learner = worker.learner
    snapshot = snapshot_checkpoint(
        directory, step=2, model=learner.model, optimizer=learner.optimizer, data_position={"index": 16}, config={}
    )
    assert snapshot is not None
    snapshot.optimizer_state["killed here"] = KillsTheProcess()
    writer = CheckpointWriter()
    writer.start(snapshot)
    writer.wait()


def test_a_write_killed_midway_leaves_the_previous_checkpoint_the_latest_and_a_resume_starts_from_it(
    base_model: Path, tmp_path: Path
):
    trainer = multiprocessing.get_context("spawn").Process(
        target=write_then_die_writing, args=(str(base_model), str(tmp_path))
    )
    trainer.start()
    trainer.join(timeout=300)

    assert trainer.exitcode == -signal.SIGKILL
    (left,) = tmp_path.glob(".tmp-step_00000002-*")
    assert (left / "model.safetensors").is_file() and not (left / "meta.json").exists(), "killed midway"
    assert not checkpoint_path(tmp_path, 2).exists()
    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 1)

    resumed = started_policy(base_model)
    assert resumed.resume(str(tmp_path)) == (1, {"index": 8})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001"], "what the killed write left is gone"
    saved = safetensors.torch.load_file(str(checkpoint_path(tmp_path, 1) / "model.safetensors"))
    for name, tensor in parameters(resumed).items():
        assert name not in saved or torch.equal(tensor, saved[name]), name
