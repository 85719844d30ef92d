"""The policy on 2 gloo ranks (FSDP2) against 1 rank: the same step, the same weights, interchangeable
checkpoints. Each test spawns two CPU processes."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from grpojob_api.v1alpha1 import AdvantageSpec, OptimizerSpec
from grpojob_trainer.algorithm.grpo import LossConfig
from grpojob_trainer.algorithm.samples import TrainingSample
from grpojob_trainer.policy.learner import PolicyLearner
from tests.distributed import run_on_ranks

from .models import tiny_causal_lm

CASES = [("token", 7), ("sequence", 7), ("token", 5), ("sequence", 5), ("token", 1)]
"""(loss aggregation, samples in the step). With micro-batches of 2 on 2 ranks: 7 samples split 4 + 3 (2
micro-batches each); 5 split 3 + 2 (2 and 1: rank 1 runs a padding micro-batch); 1 leaves rank 1 only
padding."""


def step_samples(count: int = 7) -> list[TrainingSample]:
    """``count`` samples of groups of 3 and varied lengths."""
    generator = torch.Generator().manual_seed(3)
    out = []
    for index in range(count):
        prompt, completion = 2 + index % 3, 1 + (5 * index) % 7
        tokens = torch.randint(1, 64, (prompt + completion,), generator=generator).tolist()
        out.append(
            TrainingSample(
                token_ids=tuple(tokens),
                generated_mask=(False,) * prompt + (True,) * completion,
                generation_log_probs=(0.0,) * prompt + (-3.5 - 0.1 * index,) * completion,
                reward=float(index % 3 == 1) + 0.25 * (index % 2),
                group_index=index // 3,
            )
        )
    return out


def new_trainer(aggregation: str = "token", mesh=None, packed: bool = False) -> PolicyLearner:
    return PolicyLearner(
        tiny_causal_lm(seed=2, tied=True),
        optimizer=OptimizerSpec(learningRate=1e-3, weightDecay=0.01),
        loss=LossConfig(kl_coef=0.05, aggregation=aggregation),
        advantage=AdvantageSpec(),
        micro_batch_size=2,
        temperature=0.9,
        pad_token_id=0,
        mesh=mesh,
        packed=packed,
    )


def gathered(trainer: PolicyLearner) -> dict[str, torch.Tensor]:
    from grpojob_trainer.policy.ranks import trainable_weights

    return {name: tensor.clone() for name, tensor in trainable_weights(trainer.model)}


def join(rank: int, world: int, host: str, port: int):
    from grpojob_trainer.policy.ranks import init_ranks

    return init_ranks(host, port, rank=rank, world=world, backend="gloo")


def rank_steps(rank: int, world: int, host: str, port: int) -> dict:
    mesh = join(rank, world, host, port)
    out = {}
    for aggregation, count in CASES:
        trainer = new_trainer(aggregation, mesh)
        initial = gathered(trainer)
        metrics = trainer.train_step(step_samples(count))
        out[aggregation, count] = {"initial": initial, "metrics": metrics, "after": gathered(trainer)}
    return out


def test_a_step_on_two_ranks_equals_the_step_on_one():
    ranks = run_on_ranks(rank_steps, 2)
    for case in CASES:
        aggregation, count = case
        trainer = new_trainer(aggregation)
        unsharded = gathered(trainer)
        metrics = trainer.train_step(step_samples(count))
        two = ranks[0][case]
        # the weights gathered from the shards are the unsharded model's, on every rank
        assert two["initial"].keys() == unsharded.keys()
        for rank in ranks:
            for name, tensor in rank[case]["initial"].items():
                assert torch.equal(tensor, unsharded[name]), name
        for name, param in gathered(trainer).items():
            torch.testing.assert_close(two["after"][name], param, atol=2e-6, rtol=1e-4, msg=f"{case}: {name}")
        for key in ("loss", "grad_norm", "kl", "ratio_mean", "is_weight_mean", "clip_frac_low", "ratio_max"):
            assert two["metrics"][key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-6), (case, key)
        for key in ("tokens", "generated_tokens", "reward_mean", "advantage_abs_mean"):
            assert two["metrics"][key] == metrics[key], (case, key)
        assert ranks[1][case]["metrics"]["loss"] == two["metrics"]["loss"]


PACKED_CASES = [("token", 5), ("token", 1)]
"""Cases where rank 1 runs padding micro-batches (an empty loss mask), trained packed."""


def rank_packed_steps(rank: int, world: int, host: str, port: int) -> dict:
    mesh = join(rank, world, host, port)
    out = {}
    for aggregation, count in PACKED_CASES:
        trainer = new_trainer(aggregation, mesh, packed=True)
        metrics = trainer.train_step(step_samples(count))
        out[aggregation, count] = {"metrics": metrics, "after": gathered(trainer)}
    return out


def test_a_packed_step_on_two_ranks_equals_the_padded_step_on_one():
    ranks = run_on_ranks(rank_packed_steps, 2)
    for case in PACKED_CASES:
        trainer = new_trainer(case[0])
        metrics = trainer.train_step(step_samples(case[1]))
        two = ranks[0][case]
        for name, param in gathered(trainer).items():
            torch.testing.assert_close(two["after"][name], param, atol=2e-6, rtol=1e-4, msg=f"{case}: {name}")
        for key in ("loss", "grad_norm", "kl", "ratio_mean", "is_weight_mean", "tokens", "generated_tokens"):
            assert two["metrics"][key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-6), (case, key)


def full_state(trainer: PolicyLearner) -> tuple[dict, dict]:
    """A copy of the gathered state (on the CPU, some of it are the live tensors)."""
    from grpojob_trainer.policy.state import gather_state

    return copy.deepcopy(gather_state(trainer.model, trainer.optimizer))


def rank_checkpoints(rank: int, world: int, host: str, port: int, one_rank_checkpoint: str, directory: str) -> dict:
    from grpojob_trainer.policy.checkpoint import load_checkpoint, save_checkpoint

    trainer = new_trainer(mesh=join(rank, world, host, port))
    load_checkpoint(one_rank_checkpoint, model=trainer.model, optimizer=trainer.optimizer)
    resumed = full_state(trainer)
    trainer.train_step(step_samples())
    save_checkpoint(directory, step=2, model=trainer.model, optimizer=trainer.optimizer, data_position={}, config={})
    return {"resumed": resumed, "saved": full_state(trainer)}


def plain(groups: list[dict]) -> list[dict]:
    """Parameter groups with tuples as lists (``betas`` comes back from a state dict as either)."""
    return [{key: list(value) if isinstance(value, tuple) else value for key, value in g.items()} for g in groups]


def assert_same_state(left: tuple[dict, dict], right: tuple[dict, dict]) -> None:
    (left_model, left_optimizer), (right_model, right_optimizer) = left, right
    assert left_model.keys() == right_model.keys()
    for name, tensor in left_model.items():
        assert torch.equal(tensor, right_model[name]), name
    assert plain(left_optimizer["param_groups"]) == plain(right_optimizer["param_groups"])
    assert left_optimizer["state"].keys() == right_optimizer["state"].keys()
    for index, state in left_optimizer["state"].items():
        for key, value in state.items():
            assert torch.equal(value.cpu(), right_optimizer["state"][index][key].cpu()), (index, key)


def test_checkpoints_move_between_one_and_two_ranks(tmp_path: Path):
    from grpojob_trainer.policy.checkpoint import load_checkpoint, save_checkpoint

    one = new_trainer()
    one.train_step(step_samples())
    first = save_checkpoint(
        tmp_path, step=1, model=one.model, optimizer=one.optimizer, data_position={"epoch": 0}, config={}
    )
    ranks = run_on_ranks(rank_checkpoints, 2, str(first), str(tmp_path))
    assert_same_state(ranks[0]["resumed"], full_state(one))  # 1 rank → 2 ranks
    assert ranks[1]["resumed"] == ({}, {})  # only rank 0 receives the gathered state

    again = new_trainer()
    info = load_checkpoint(tmp_path / "step_00000002", model=again.model, optimizer=again.optimizer)
    assert info.step == 2
    assert_same_state(full_state(again), ranks[0]["saved"])  # 2 ranks → 1 rank
    assert "lm_head.weight" not in full_state(again)[0]  # tied weights stored once
