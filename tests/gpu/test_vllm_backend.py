"""The vLLM generation backend on a GPU: token ids and log-probabilities the trainer agrees with,
weights loaded from the policy on the same GPU, and the OpenAI-compatible server's token contract.

Runs where CUDA and vLLM are present (the H200); elsewhere every test skips and says why."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the H200)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (installed on the GPU machine)"),
]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TEMPERATURE, TOP_P = 1.0, 1.0


def small_model(directory: Path, seed: int) -> Path:
    """A random model with head_dim 64 (vLLM's attention kernels want it) and the tiny tokenizer."""
    from grpojob_trainer.tiny_model import TinyModelConfig, write_tiny_model

    config = TinyModelConfig(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        seed=seed,
    )
    return write_tiny_model(directory, config)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> tuple[Path, Path]:
    return small_model(tmp_path_factory.mktemp("model-a"), 0), small_model(tmp_path_factory.mktemp("model-b"), 1)


@pytest.fixture(scope="module")
def backend(model_dirs):
    from grpojob_trainer.generation.vllm_backend import VLLMBackend

    return VLLMBackend(model_dirs[0], max_model_len=512, gpu_memory_utilization=0.3, enforce_eager=True)


def prompts(backend, count: int) -> list[tuple[int, ...]]:
    questions = [f"What is {i % 10}+{(3 * i) % 10}?" for i in range(count)]
    return [
        tuple(
            backend.tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, return_dict=True
            )["input_ids"]
        )
        for q in questions
    ]


def generate(backend, count: int = 16, max_new_tokens: int = 24):
    from grpojob_trainer.generation.backend import GenerationRequest, SamplingParams

    requests = [GenerationRequest(p, max_new_tokens) for p in prompts(backend, count)]
    return requests, backend.generate(requests, SamplingParams(TEMPERATURE, TOP_P, max_new_tokens))


def trainer_logprobs(model_dir: Path, requests, results) -> list[torch.Tensor]:
    """The trainer's log-probabilities of the generated tokens (bf16 forward, as in training)."""
    from transformers import AutoModelForCausalLM

    from grpojob_trainer.policy import build_batch, token_logprobs
    from grpojob_trainer.samples import TrainingSample

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, local_files_only=True).cuda()
    samples = [
        TrainingSample(
            token_ids=(*req.prompt_token_ids, *res.token_ids),
            generated_mask=(False,) * len(req.prompt_token_ids) + (True,) * len(res.token_ids),
            generation_log_probs=(0.0,) * len(req.prompt_token_ids) + res.log_probs,
            reward=0.0,
            group_index=0,
        )
        for req, res in zip(requests, results, strict=True)
    ]
    batch = build_batch(samples, pad_token_id=0).to(torch.device("cuda"))
    with torch.no_grad():
        logprobs = token_logprobs(model, batch, TEMPERATURE)
    return [logprobs[i][batch.loss_mask[i]].float().cpu() for i in range(len(samples))]


def test_generation_returns_token_ids_with_a_log_probability_each(backend):
    _, results = generate(backend)
    eos = backend.tokenizer.eos_token_id
    for result in results:
        assert 0 < len(result.token_ids) == len(result.log_probs) <= 24
        assert all(lp <= 0.0 for lp in result.log_probs)
        if result.finish_reason == "stop":
            assert result.token_ids[-1] == eos


def test_the_trainer_recomputes_the_engines_log_probabilities(backend, model_dirs):
    requests, results = generate(backend, count=32)
    recomputed = trainer_logprobs(model_dirs[0], requests, results)
    engine = [torch.tensor(r.log_probs) for r in results]
    gap = torch.cat([(a - b).abs() for a, b in zip(engine, recomputed, strict=True)])
    print(f"vLLM vs trainer log-prob |diff|: mean {gap.mean():.4f}, max {gap.max():.4f} over {gap.numel()} tokens")
    assert gap.mean() < 0.05


def test_weights_from_the_policy_reach_the_engine_on_the_same_gpu(backend, model_dirs):
    from transformers import AutoModelForCausalLM

    new_policy = AutoModelForCausalLM.from_pretrained(model_dirs[1], dtype=torch.bfloat16, local_files_only=True)
    tensors = [(name, t.cuda()) for name, t in new_policy.state_dict().items()]
    torch.cuda.synchronize()
    started = time.perf_counter()
    version = backend.update_weights(tensors)
    torch.cuda.synchronize()
    print(f"weight sync (in process, same GPU): {1000 * (time.perf_counter() - started):.1f} ms")
    assert version == 1

    requests, results = generate(backend, count=32)
    assert all(r.weights_version == 1 for r in results)
    engine = torch.cat([torch.tensor(r.log_probs) for r in results])
    under_new = torch.cat(trainer_logprobs(model_dirs[1], requests, results))
    under_old = torch.cat(trainer_logprobs(model_dirs[0], requests, results))
    assert (engine - under_new).abs().mean() < 0.05, "the engine now samples from the new weights"
    assert (engine - under_old).abs().mean() > 4 * (engine - under_new).abs().mean()


def test_the_openai_server_keeps_multi_turn_tokens_contiguous_on_vllm(backend):
    import openai

    from grpojob_trainer.generation.app import ServerConfig
    from grpojob_trainer.generation.backend import SamplingParams
    from grpojob_trainer.generation.server import GenerationServer

    config = ServerConfig("gpu-policy", SamplingParams(TEMPERATURE, TOP_P, 16))
    with GenerationServer(backend, config) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="dummy", max_retries=0)
        request = {"model": "gpu-policy", "temperature": TEMPERATURE, "top_p": TOP_P}
        first_messages = [{"role": "user", "content": "Say a number."}]
        first = client.chat.completions.create(messages=first_messages, **request).choices[0].message
        history = [*first_messages, first.model_dump(exclude_none=True), {"role": "user", "content": "Another."}]
        second = client.chat.completions.create(messages=history, **request).choices[0].message
        earlier = first.prompt_token_ids + first.generation_token_ids
        assert second.prompt_token_ids[: len(earlier)] == earlier
        with pytest.raises(openai.BadRequestError, match="temperature"):
            client.chat.completions.create(messages=first_messages, **{**request, "temperature": 0.5})
