"""The exported model serves as it is: vLLM loads the directory the trainer wrote (bfloat16, sharded
safetensors, the base's tokenizer and chat template) and generates from a chat prompt, and its
log-probabilities of a prompt are those `transformers` computes from the same directory.

Runs where CUDA and vLLM are present (the H200); elsewhere every test skips and says why."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the H200)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (installed on the GPU machine)"),
]

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SPEC = {
    "model": {"path": "unused"},
    "dataset": {"path": "rows.jsonl"},
    "environments": [{"name": "arith"}],
    "generation": {"gpusPerReplica": 1, "maxModelLen": 512, "maxNewTokens": 16},
    "training": {"gpusPerReplica": 1, "microBatchSize": 4, "optimizer": {"learningRate": 0.001}},
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, Path]:
    """A policy trained one step on the GPU from the small model (head_dim 64, as vLLM wants), exported in
    bfloat16 shards: (the base model, the exported directory)."""
    from grpojob_api.v1alpha1 import GRPOJobSpec
    from grpojob_trainer.algorithm.samples import TrainingSample
    from grpojob_trainer.models.tiny import SHAPES, write_tiny_model
    from grpojob_trainer.policy.config import RankConfig
    from grpojob_trainer.policy.worker import PolicyWorker

    base = write_tiny_model(tmp_path_factory.mktemp("base") / "small", dataclasses.replace(SHAPES["small"], seed=3))
    worker = PolicyWorker(RankConfig(GRPOJobSpec.model_validate(SPEC), str(base), seed=0))
    worker.start("127.0.0.1", 0)
    sample = TrainingSample(
        token_ids=tuple(range(10, 40)),
        generated_mask=(False,) * 10 + (True,) * 20,
        generation_log_probs=(0.0,) * 10 + (-4.0,) * 20,
        reward=1.0,
        group_index=0,
    )
    worker.train_step([sample, dataclasses.replace(sample, reward=0.0)])
    from grpojob_trainer.policy.export import write_model
    from grpojob_trainer.policy.state import gather_model_state

    out = write_model(
        gather_model_state(worker.learner.model),
        tmp_path_factory.mktemp("out") / "final",
        base=base,
        dtype="bfloat16",
        max_shard_size="1MB",
    )
    del worker
    torch.cuda.empty_cache()
    return base, out


def test_vllm_serves_the_exported_model_with_the_bases_chat_template(exported):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams

    base, out = exported
    assert len(list(out.glob("model-*.safetensors"))) > 1, "the test model is written in several shards"
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(base).chat_template
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True
    )

    llm = LLM(model=str(out), dtype="bfloat16", max_model_len=512, gpu_memory_utilization=0.3, enforce_eager=True)
    try:
        generated = llm.generate([prompt], SamplingParams(temperature=1.0, max_tokens=16, seed=0))[0]
        assert len(generated.outputs[0].token_ids) > 0
        scored = llm.generate([prompt], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    finally:
        del llm
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert list(scored.prompt_token_ids) == ids
    vllm_logprobs = [next(iter(entry.values())).logprob for entry in scored.prompt_logprobs[1:]]

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16).cuda().eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids], device="cuda")).logits[0, :-1].float()
    expected = logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:], device="cuda")[:, None])[:, 0].cpu()
    torch.testing.assert_close(torch.tensor(vllm_logprobs), expected, atol=0.1, rtol=0.05)
