"""A LoRA policy's adapter served by vLLM: registered in memory (no file anywhere), by value and by CUDA
IPC; each version sampled from as the policy computes it; the base before the first one.

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
RANK = 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    import dataclasses

    from grpojob_trainer.models.tiny import SHAPES, write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("base"), dataclasses.replace(SHAPES["small"], seed=0))


@pytest.fixture(scope="module")
def engine(model_dir):
    from grpojob_trainer.generation.vllm_backend import VLLMBackend

    started = VLLMBackend(model_dir, max_model_len=512, gpu_memory_utilization=0.3, enforce_eager=True, lora_rank=RANK)
    yield started
    started.shutdown()


def lora_policy(model_dir: Path, seed: int) -> torch.nn.Module:
    """The base with a LoRA adapter whose B matrices are random (a trained adapter changes the model)."""
    from transformers import AutoModelForCausalLM

    from grpojob_api.v1alpha1 import LoraSpec
    from grpojob_trainer.policy.lora import apply_lora

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, local_files_only=True).cuda()
    model = apply_lora(base, LoraSpec(rank=RANK, alpha=16))
    generator = torch.Generator(device="cuda").manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator, device="cuda") * 0.05)
    return model


def generate(engine, count: int = 32, max_new_tokens: int = 24):
    from grpojob_trainer.generation.backend import GenerationRequest, SamplingParams

    questions = [f"What is {i % 10}+{(3 * i) % 10}?" for i in range(count)]
    requests = [
        GenerationRequest(
            tuple(
                engine.tokenizer.apply_chat_template(
                    [{"role": "user", "content": q}], add_generation_prompt=True, return_dict=True
                )["input_ids"]
            ),
            max_new_tokens,
        )
        for q in questions
    ]
    return requests, engine.generate(requests, SamplingParams(1.0, 1.0, max_new_tokens))


def logprob_gap(model: torch.nn.Module, requests, results) -> float:
    """Mean |engine - policy| log-probability of the sampled tokens (bf16 autocast, as in training)."""
    from grpojob_trainer.algorithm.samples import TrainingSample
    from grpojob_trainer.policy.forward import build_batch, token_logprobs

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
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        logprobs = token_logprobs(model, batch, 1.0)
    mask = batch.loss_mask
    return float((logprobs[mask].float() - batch.generation_logprobs[mask]).abs().mean())


def test_adapters_registered_in_memory_are_what_the_engine_samples_from(engine, model_dir):
    from grpojob_trainer.policy.lora import adapter_config, adapter_weights
    from grpojob_trainer.weight_sync.buckets import plan_buckets, share_buckets

    requests, results = generate(engine)
    assert all(r.weights_version == engine.weights_version for r in results)
    first, second = lora_policy(model_dir, seed=1), lora_policy(model_dir, seed=2)
    with first.disable_adapter():
        assert logprob_gap(first, requests, results) < 0.05, "before any adapter the engine serves the base"

    config = adapter_config(first, str(model_dir))
    started = time.perf_counter()
    by_value = engine.update_adapter(config, list(adapter_weights(first)))
    print(f"adapter sync (by value): {1000 * (time.perf_counter() - started):.1f} ms")
    requests, results = generate(engine)
    assert all(r.weights_version == by_value for r in results)
    now, other = logprob_gap(first, requests, results), logprob_gap(second, requests, results)
    print(f"log-prob gap to the adapter served: {now:.4f}, to another adapter: {other:.4f}")
    assert now < 0.05 and other > 4 * now

    tensors = dict(adapter_weights(second))
    layouts = plan_buckets([(n, t.shape) for n, t in tensors.items()], bucket_bytes=1 << 20, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    started = time.perf_counter()
    payload, _buckets = share_buckets(layouts, tensors, torch.device("cuda", 0))
    by_ipc = engine.update_adapter_ipc(config, payload)
    print(
        f"adapter sync (CUDA IPC, {sum(t.numel() for t in tensors.values())} parameters): "
        f"{1000 * (time.perf_counter() - started):.1f} ms"
    )
    assert by_ipc == by_value + 1
    requests, results = generate(engine)
    now, before = logprob_gap(second, requests, results), logprob_gap(first, requests, results)
    assert now < 0.05 and before > 4 * now


def test_later_versions_are_written_in_place_and_sampled_from(engine, model_dir):
    """Versions 3 and 4 go over the places of versions 1 and 2 (their LoRA ids): each is what the engine
    samples from next, and the previous one stays served beside it."""
    from grpojob_trainer.policy.lora import adapter_config, adapter_weights
    from grpojob_trainer.weight_sync.buckets import plan_buckets, share_buckets

    policies = [lora_policy(model_dir, seed=seed) for seed in (1, 2, 3, 4)]
    config = adapter_config(policies[0], str(model_dir))
    written_before, versions_before = engine.adapters_written_in_place, engine.weights_version
    for index, policy in enumerate(policies):
        tensors = dict(adapter_weights(policy))
        layouts = plan_buckets([(n, t.shape) for n, t in tensors.items()], bucket_bytes=1 << 20, dtype=torch.bfloat16)
        torch.cuda.synchronize()
        started = time.perf_counter()
        payload, _buckets = share_buckets(layouts, tensors, torch.device("cuda", 0))
        engine.update_adapter_ipc(config, payload)
        print(f"adapter sync {index + 1} of 4 (CUDA IPC): {1000 * (time.perf_counter() - started):.1f} ms")
        requests, results = generate(engine)
        now = logprob_gap(policy, requests, results)
        if index:
            before = logprob_gap(policies[index - 1], requests, results)
            assert now < 0.05 and before > 4 * now, (index, now, before)
    # The first version each LoRA id serves is registered; every later one is written in place.
    from grpojob_trainer.generation.vllm_extension import ADAPTERS_KEPT

    registered = max(0, ADAPTERS_KEPT - versions_before)
    assert engine.adapters_written_in_place - written_before == 4 - registered
