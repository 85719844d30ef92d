"""The policy on 2 GPUs (FSDP2 over NCCL, bf16 autocast) against 1 GPU: the same step within tolerance.

Needs only torch, transformers and the tiny-model helper (no Ray, no vLLM). Skips with fewer than two
CUDA GPUs; run with ``pytest tests/gpu/test_fsdp.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.distributed import run_on_ranks

pytestmark = pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs at least 2 CUDA GPUs (FSDP2 over NCCL on 2 ranks)"
)


def samples(count: int = 13, length: int = 48):
    from grpojob_trainer.algorithm.samples import TrainingSample

    generator = torch.Generator().manual_seed(0)
    out = []
    for index in range(count):
        tokens = torch.randint(8, 100, (length - index,), generator=generator).tolist()
        generated = len(tokens) - 16
        out.append(
            TrainingSample(
                token_ids=tuple(tokens),
                generated_mask=(False,) * 16 + (True,) * generated,
                generation_log_probs=(0.0,) * 16 + (-4.6,) * generated,
                reward=float(index % 3 == 0),
                group_index=index // 4,
            )
        )
    return out


def trainer(model_dir: str, mesh=None):
    from transformers import AutoModelForCausalLM

    from grpojob_api.v1alpha1 import AdvantageSpec, OptimizerSpec
    from grpojob_trainer.algorithm.grpo import LossConfig
    from grpojob_trainer.policy.learner import PolicyLearner

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True).cuda()
    return PolicyLearner(
        model,
        optimizer=OptimizerSpec(learning_rate=1e-4),
        loss=LossConfig(kl_coef=0.01),
        advantage=AdvantageSpec(),
        micro_batch_size=4,
        temperature=1.0,
        pad_token_id=0,
        precision="bf16",
        mesh=mesh,
    )


def step(trainer) -> tuple[dict, dict]:
    from grpojob_trainer.policy.ranks import trainable_weights

    metrics = trainer.train_step(samples())
    return metrics, {name: tensor.float().cpu() for name, tensor in trainable_weights(trainer.model)}


def rank_step(rank: int, world: int, host: str, port: int, model_dir: str):
    from grpojob_trainer.policy.ranks import init_ranks

    torch.cuda.set_device(rank)
    return step(trainer(model_dir, init_ranks(host, port, rank=rank, world=world, backend="nccl")))


def test_a_bf16_step_on_two_gpus_matches_the_step_on_one(tmp_path: Path):
    from grpojob_trainer.models.tiny import SHAPES, write_tiny_model

    model_dir = str(write_tiny_model(tmp_path / "model", SHAPES["small"]))
    one_metrics, one_weights = step(trainer(model_dir))
    (two_metrics, two_weights), _ = run_on_ranks(rank_step, 2, model_dir)
    print(
        f"loss 1 GPU {one_metrics['loss']:.5f} 2 GPUs {two_metrics['loss']:.5f}; "
        f"grad norm {one_metrics['grad_norm']:.4f} / {two_metrics['grad_norm']:.4f}"
    )
    assert two_metrics["loss"] == pytest.approx(one_metrics["loss"], abs=2e-3)
    assert two_metrics["grad_norm"] == pytest.approx(one_metrics["grad_norm"], rel=2e-2)
    assert two_metrics["tokens"] == one_metrics["tokens"]
    assert two_weights.keys() == one_weights.keys()
    for name, weight in one_weights.items():
        # Adam's first step moves each weight by about the learning rate; bf16 noise may flip a few
        torch.testing.assert_close(two_weights[name], weight, atol=2e-4, rtol=0, msg=name)
