"""The packed forward with torch's varlen_attn flash kernel on a GPU: chosen by the trainer there, and a
bf16 step through it agrees with the padded forward's and with float32 training.

Runs where CUDA and ``torch.nn.attention.varlen`` (torch 2.10+) are present (the H200); elsewhere it
skips and says why. ``benchmarks/varlen_check.py`` prints the same comparisons with their figures."""

from __future__ import annotations

import pytest
import torch

from grpojob_trainer.policy.packing import varlen_available
from tests.gpu.test_policy_training import samples

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not varlen_available(torch.device("cuda")),
    reason="needs a CUDA GPU and torch's varlen_attn (runs on the H200)",
)


def trainer(tmp_path, precision: str, packed: bool | None):
    from transformers import AutoModelForCausalLM

    from grpojob_api.v1alpha1 import AdvantageSpec, OptimizerSpec
    from grpojob_trainer.algorithm.grpo import LossConfig
    from grpojob_trainer.models.tiny import SHAPES, write_tiny_model
    from grpojob_trainer.policy.learner import PolicyLearner

    path = write_tiny_model(tmp_path / "model", SHAPES["small"])
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).cuda()
    return PolicyLearner(
        model,
        optimizer=OptimizerSpec(learning_rate=1e-4),
        loss=LossConfig(kl_coef=0.01),
        advantage=AdvantageSpec(),
        micro_batch_size=8,
        temperature=1.0,
        pad_token_id=0,
        precision=precision,
        packed=packed,
    )


def test_a_bf16_step_through_varlen_attention_matches_the_padded_step_and_float32(tmp_path):
    packed = trainer(tmp_path / "a", "bf16", packed=None)  # the trainer's own choice on this GPU
    padded = trainer(tmp_path / "b", "bf16", packed=False)
    fp32 = trainer(tmp_path / "c", "fp32", packed=None)
    assert (packed.packed, padded.packed, fp32.packed) == (True, False, False)
    batch = samples(lengths=(20, 120))
    metrics = {name: t.train_step(batch) for name, t in (("packed", packed), ("padded", padded), ("fp32", fp32))}
    print({name: (round(m["loss"], 5), round(m["grad_norm"], 4), round(m["kl"], 6)) for name, m in metrics.items()})
    for reference in ("padded", "fp32"):
        assert metrics["packed"]["loss"] == pytest.approx(metrics[reference]["loss"], abs=2e-2), reference
        assert metrics["packed"]["grad_norm"] == pytest.approx(metrics[reference]["grad_norm"], rel=0.1), reference
