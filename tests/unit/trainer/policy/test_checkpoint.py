"""Checkpoints: an exact resume, self-description, keep-K pruning, half-written checkpoints ignored, and a snapshot
that stays as it was while the policy trains on."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

from grpojob_api.v1alpha1 import AdvantageSpec, OptimizerSpec
from grpojob_trainer.algorithm.grpo import LossConfig
from grpojob_trainer.algorithm.samples import TrainingSample
from grpojob_trainer.policy.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    snapshot_checkpoint,
    write_checkpoint,
)
from grpojob_trainer.policy.learner import PolicyLearner
from grpojob_trainer.policy.state import HostCopies, available_host_bytes

from .models import tiny_causal_lm

CONFIG = {"grpo": {"promptsPerStep": 2, "generationsPerPrompt": 2}, "model": {"path": "/models/tiny"}}


def new_trainer() -> PolicyLearner:
    return PolicyLearner(
        tiny_causal_lm(0),
        optimizer=OptimizerSpec(learningRate=1e-2, weightDecay=0.01),
        loss=LossConfig(kl_coef=0.05),
        advantage=AdvantageSpec(),
        micro_batch_size=2,
        temperature=1.0,
        pad_token_id=0,
    )


def random_samples() -> list[TrainingSample]:
    """A step's rollouts drawn from Python's, NumPy's and torch's RNGs, as a data loader and sampler would."""
    samples = []
    for group in range(2):
        prompt = tuple(random.randrange(1, 64) for _ in range(3))
        for _ in range(2):
            completion = tuple(torch.randint(1, 64, (3,)).tolist())
            samples.append(
                TrainingSample(
                    token_ids=prompt + completion,
                    generated_mask=(False,) * 3 + (True,) * 3,
                    generation_log_probs=(0.0,) * 3 + (-4.0,) * 3,
                    reward=float(np.random.rand()),
                    group_index=group,
                )
            )
    return samples


def train(policy: PolicyLearner, steps: int) -> None:
    for _ in range(steps):
        policy.train_step(random_samples())


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_a_resumed_trainer_ends_with_the_same_parameters_and_random_streams(tmp_path: Path):
    seed_everything(1)
    first = new_trainer()
    train(first, 2)
    saved = save_checkpoint(
        tmp_path, step=2, model=first.model, optimizer=first.optimizer, data_position={"row": 4}, config=CONFIG
    )
    train(first, 2)
    expected_draws = rng_draws()

    seed_everything(99)
    resumed = new_trainer()
    assert latest_checkpoint(tmp_path) == saved
    info = load_checkpoint(saved, model=resumed.model, optimizer=resumed.optimizer)
    assert (info.step, info.data_position, info.config) == (2, {"row": 4}, CONFIG)
    train(resumed, 2)

    for (name, expected), actual in zip(first.model.named_parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(expected, actual), name
    assert rng_draws() == expected_draws


def test_a_checkpoint_describes_itself(tmp_path: Path):
    policy = new_trainer()
    path = save_checkpoint(
        tmp_path, step=7, model=policy.model, optimizer=policy.optimizer, data_position={}, config=CONFIG
    )
    assert path.name == "step_00000007"
    meta = json.loads((path / "meta.json").read_text())
    assert meta["step"] == 7 and meta["config"] == CONFIG
    assert meta["model_config"]["hidden_size"] == 32 and meta["model_config"]["model_type"] == "qwen2"
    assert sorted(p.name for p in path.iterdir()) == ["meta.json", "model.safetensors", "optimizer.pt", "rng.pt"]


def test_only_the_newest_k_checkpoints_are_kept(tmp_path: Path):
    policy = new_trainer()
    for step in range(1, 6):
        save_checkpoint(
            tmp_path, step=step, model=policy.model, optimizer=policy.optimizer, data_position={}, config={}, keep=2
        )
    assert [step for step, _ in list_checkpoints(tmp_path)] == [4, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000004", "step_00000005"]


def test_half_written_checkpoints_are_ignored_and_cleaned_up(tmp_path: Path):
    policy = new_trainer()
    save_checkpoint(tmp_path, step=3, model=policy.model, optimizer=policy.optimizer, data_position={}, config={})
    # What a save killed mid-write leaves: its temporary directory; and a step directory without meta.json.
    interrupted = tmp_path / ".tmp-step_00000004-abc123"
    interrupted.mkdir()
    (interrupted / "model.safetensors").write_bytes(b"\x00" * 10)
    (tmp_path / "step_00000005").mkdir()
    (tmp_path / "step_00000005" / "model.safetensors").write_bytes(b"\x00" * 10)

    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000003"
    prune_checkpoints(tmp_path, keep=2)
    assert not interrupted.exists()
    assert latest_checkpoint(tmp_path / "absent") is None


def test_a_failed_save_leaves_nothing_behind(tmp_path: Path):
    policy = new_trainer()
    with pytest.raises(TypeError):
        save_checkpoint(
            tmp_path, step=1, model=policy.model, optimizer=policy.optimizer, data_position={"x": object()}, config={}
        )
    assert list(tmp_path.iterdir()) == []


def test_a_snapshot_stays_as_it_was_saved_while_the_policy_trains_on(tmp_path: Path):
    seed_everything(1)
    policy = new_trainer()
    train(policy, 1)
    snapshot = snapshot_checkpoint(
        tmp_path, step=1, model=policy.model, optimizer=policy.optimizer, data_position={"row": 2}, config=CONFIG
    )
    assert snapshot is not None
    saved = copy.deepcopy((snapshot.model_state, snapshot.optimizer_state))
    train(policy, 1)  # in place: parameters, moments and step counts

    for name, tensor in snapshot.model_state.items():
        assert torch.equal(tensor, saved[0][name]), name
    for index, state in snapshot.optimizer_state["state"].items():
        for key, tensor in state.items():
            assert torch.equal(tensor, saved[1]["state"][index][key]), (index, key)

    resumed = new_trainer()
    info = load_checkpoint(write_checkpoint(snapshot), model=resumed.model, optimizer=resumed.optimizer)
    assert info.step == 1 and info.data_position == {"row": 2}


def test_a_state_whose_copy_would_not_fit_the_host_memory_left_is_written_from_the_policy_itself(tmp_path: Path):
    # A full fine-tune's state in a pod sized for the model: no second copy in host memory, the same checkpoint.
    seed_everything(1)
    policy = new_trainer()
    train(policy, 2)
    snapshots = {
        name: snapshot_checkpoint(
            tmp_path / name,
            step=2,
            model=policy.model,
            optimizer=policy.optimizer,
            data_position={"row": 4},
            config=CONFIG,
            host=HostCopies(available=available),
        )
        for name, available in (("copied", lambda: 1 << 40), ("streamed", lambda: 0))
    }
    copied, streamed = snapshots["copied"], snapshots["streamed"]
    assert copied is not None and streamed is not None and not copied.live and streamed.live
    policy_storages = {t.untyped_storage().data_ptr() for t in policy.model.state_dict().values()}
    assert all(t.untyped_storage().data_ptr() in policy_storages for t in streamed.model_state.values())
    assert not any(t.untyped_storage().data_ptr() in policy_storages for t in copied.model_state.values())

    written = {name: write_checkpoint(snapshot) for name, snapshot in snapshots.items()}
    models = {name: safetensors.torch.load_file(str(path / "model.safetensors")) for name, path in written.items()}
    assert models["copied"].keys() == models["streamed"].keys()
    assert all(torch.equal(models["copied"][key], models["streamed"][key]) for key in models["copied"])
    resumed = {name: new_trainer() for name in written}
    for name, path in written.items():
        load_checkpoint(path, model=resumed[name].model, optimizer=resumed[name].optimizer, restore_rng=False)
    seed_everything(3)
    train(resumed["copied"], 1)
    seed_everything(3)
    train(resumed["streamed"], 1)  # the optimizer's moments came back alike too
    for (name, a), b in zip(
        resumed["copied"].model.named_parameters(), resumed["streamed"].model.parameters(), strict=True
    ):
        assert torch.equal(a, b), name


def test_copies_count_against_the_host_memory_left_less_the_buffers_they_reuse():
    live_cpu = torch.zeros(100, dtype=torch.float32)  # 400 bytes of the policy's own, cloned by a copy
    states = {"model": {"w": live_cpu}}
    live = {live_cpu.untyped_storage().data_ptr()}
    assert HostCopies(available=lambda: 1000).fits(states, live)
    assert not HostCopies(available=lambda: 400).fits(states, live)  # 400 > 0.8 x 400
    assert HostCopies(available=lambda: None).fits(states, live)  # nothing says: copy, as before
    assert HostCopies(available=lambda: 0).fits(states, set())  # a gathered tensor is taken as is, not copied


def test_the_host_memory_left_is_read_from_this_machine():
    left = available_host_bytes()
    total = int(next(line for line in Path("/proc/meminfo").read_text().splitlines() if "MemTotal" in line).split()[1])
    assert left is not None and 0 < left <= total * 1024
