"""Policy training on a GPU: bfloat16 autocast over float32 master weights agrees with float32 training.

Runs where CUDA is present (the H200); elsewhere it skips and says why."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the H200)")


def samples(count: int = 16, length: int = 48, lengths: tuple[int, int] | None = None):
    """``count`` samples of ``length`` tokens (or of random lengths in ``lengths``), a 16-token prompt each."""
    from grpojob_trainer.algorithm.samples import TrainingSample

    generator = torch.Generator().manual_seed(0)
    out = []
    for index in range(count):
        if lengths is not None:
            length = int(torch.randint(*lengths, (1,), generator=generator))
        tokens = torch.randint(8, 100, (length,), generator=generator).tolist()
        out.append(
            TrainingSample(
                token_ids=tuple(tokens),
                generated_mask=(False,) * 16 + (True,) * (length - 16),
                generation_log_probs=(0.0,) * 16 + (-4.6,) * (length - 16),
                reward=float(index % 3 == 0),
                group_index=index // 4,
            )
        )
    return out


def trainer(tmp_path, precision: str):
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
        loss=LossConfig(),
        advantage=AdvantageSpec(),
        micro_batch_size=8,
        temperature=1.0,
        pad_token_id=0,
        precision=precision,
    )


def test_bf16_training_keeps_float32_master_weights_and_matches_float32(tmp_path):
    bf16, fp32 = trainer(tmp_path / "a", "bf16"), trainer(tmp_path / "b", "fp32")
    before = {n: p.detach().clone() for n, p in bf16.model.named_parameters()}
    metrics_bf16 = bf16.train_step(samples())
    metrics_fp32 = fp32.train_step(samples())

    assert bf16.autocast_dtype == torch.bfloat16 and fp32.autocast_dtype is None
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())
    assert any(not torch.equal(before[n], p) for n, p in bf16.model.named_parameters())
    print(
        f"loss bf16 {metrics_bf16['loss']:.5f} fp32 {metrics_fp32['loss']:.5f}; "
        f"grad norm bf16 {metrics_bf16['grad_norm']:.4f} fp32 {metrics_fp32['grad_norm']:.4f}; "
        f"train tokens/s bf16 {metrics_bf16['train_tokens_per_s']:.0f}"
    )
    assert metrics_bf16["loss"] == pytest.approx(metrics_fp32["loss"], abs=2e-2)
    assert metrics_bf16["grad_norm"] == pytest.approx(metrics_fp32["grad_norm"], rel=0.1)


def test_a_policy_too_large_for_the_gpu_is_refused_before_its_weights_load(tmp_path):
    from grpojob_api.v1alpha1 import GRPOJobSpec
    from grpojob_trainer.models.tiny import SHAPES, build_tokenizer, llama_config
    from grpojob_trainer.policy.memory import PolicyDoesNotFit
    from grpojob_trainer.policy.worker import PolicyWorker

    model = tmp_path / "model"  # a config and a tokenizer, no weights: loading them would fail otherwise
    llama_config(SHAPES["qwen2.5-7b"]).save_pretrained(model)
    build_tokenizer(SHAPES["qwen2.5-7b"].vocab_size).save_pretrained(model)
    spec = GRPOJobSpec.model_validate(
        {
            "model": {"path": str(model)},
            "dataset": {"path": "unused.jsonl"},
            "environments": [{"name": "arithmetic"}],
            "training": {"replicas": 1, "gpusPerReplica": 1},
        }
    )
    worker = PolicyWorker(spec.model_dump(by_alias=True), str(model), seed=0)
    with pytest.raises(PolicyDoesNotFit, match=r"spec\.training\.lora"):
        worker.start("127.0.0.1", 0)
