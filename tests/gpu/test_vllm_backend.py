"""The vLLM generation backend on a GPU: token ids and log-probabilities the trainer agrees with,
weights loaded from the policy (by value, by CUDA IPC on the same GPU, by NCCL broadcast from another
GPU), and the OpenAI-compatible server's token contract.

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
    import dataclasses

    from grpojob_trainer.models.tiny import SHAPES, write_tiny_model

    return write_tiny_model(directory, dataclasses.replace(SHAPES["small"], seed=seed))


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> tuple[Path, Path]:
    return small_model(tmp_path_factory.mktemp("model-a"), 0), small_model(tmp_path_factory.mktemp("model-b"), 1)


@pytest.fixture(scope="module")
def engine(model_dirs):
    """One vLLM engine for the module (starting one takes a while), first loaded from model A. Tests take
    it through `backend`, or load model A themselves with `serve_model_a`, so that none depends on what
    another loaded: each runs alone or in any order."""
    from grpojob_trainer.generation.vllm_backend import VLLMBackend

    started = VLLMBackend(model_dirs[0], max_model_len=512, gpu_memory_utilization=0.3, enforce_eager=True)
    yield started
    started.shutdown()


def serve_model_a(engine, model_dirs) -> int:
    """Load model A's weights into the engine (by value); returns its weights version now."""
    return engine.update_weights(policy_tensors(model_dirs[0]).items())


@pytest.fixture
def backend(engine, model_dirs):
    """The module's engine serving model A's weights, whatever an earlier test loaded into it."""
    serve_model_a(engine, model_dirs)
    return engine


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

    from grpojob_trainer.algorithm.samples import TrainingSample
    from grpojob_trainer.policy.forward import build_batch, token_logprobs

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
    sampled = [torch.tensor(r.log_probs) for r in results]
    gap = torch.cat([(a - b).abs() for a, b in zip(sampled, recomputed, strict=True)])
    print(f"vLLM vs trainer log-prob |diff|: mean {gap.mean():.4f}, max {gap.max():.4f} over {gap.numel()} tokens")
    assert gap.mean() < 0.05


def policy_tensors(model_dir: Path, device: str = "cuda") -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    from grpojob_trainer.policy.ranks import trainable_weights

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True).to(device)
    return {name: tensor.clone() for name, tensor in trainable_weights(model)}


def assert_engine_samples_from(backend, model_dirs, now: int, before: int, version: int) -> None:
    requests, results = generate(backend, count=32)
    assert all(r.weights_version == version for r in results)
    sampled = torch.cat([torch.tensor(r.log_probs) for r in results])
    under_now = torch.cat(trainer_logprobs(model_dirs[now], requests, results))
    under_before = torch.cat(trainer_logprobs(model_dirs[before], requests, results))
    assert (sampled - under_now).abs().mean() < 0.05, "the engine samples from the new weights"
    assert (sampled - under_before).abs().mean() > 4 * (sampled - under_now).abs().mean()


def test_weights_sent_by_value_reach_the_engine(engine, model_dirs):
    before = serve_model_a(engine, model_dirs)
    tensors = policy_tensors(model_dirs[1])
    started = time.perf_counter()
    version = engine.update_weights(tensors.items())
    print(f"weight sync (by value through the host): {1000 * (time.perf_counter() - started):.1f} ms")
    assert version == before + 1
    assert_engine_samples_from(engine, model_dirs, now=1, before=0, version=version)


def test_weights_shared_by_cuda_ipc_reach_the_engine_without_leaving_the_gpu(engine, model_dirs):
    from grpojob_trainer.weight_sync.buckets import plan_buckets, share_buckets

    before = serve_model_a(engine, model_dirs)
    tensors = policy_tensors(model_dirs[1])
    layouts = plan_buckets([(n, t.shape) for n, t in tensors.items()], bucket_bytes=1 << 20, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    started = time.perf_counter()
    payload, buckets = share_buckets(layouts, tensors, torch.device("cuda", 0))
    version = engine.update_weights_ipc(payload)
    elapsed = time.perf_counter() - started
    print(f"weight sync (CUDA IPC, same GPU, {len(buckets)} buckets): {1000 * elapsed:.1f} ms")
    assert len(layouts) > 1 and version == before + 1
    assert_engine_samples_from(engine, model_dirs, now=1, before=0, version=version)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (NCCL broadcast between GPUs)")
def test_weights_broadcast_over_nccl_from_another_gpu_reach_the_engine(engine, model_dirs):
    import pickle
    import socket
    import threading

    from grpojob_trainer.weight_sync.buckets import WeightBroadcastGroup, plan_buckets

    before = serve_model_a(engine, model_dirs)
    with torch.cuda.device(1):  # the policy's GPU (for this test only); the engine's worker uses GPU 0
        tensors = policy_tensors(model_dirs[1], device="cuda:1")
        layouts = plan_buckets([(n, t.shape) for n, t in tensors.items()], bucket_bytes=1 << 20, dtype=torch.bfloat16)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        joined = threading.Thread(target=engine.join_weight_group, args=("127.0.0.1", port, 2, 1))
        joined.start()
        group = WeightBroadcastGroup("127.0.0.1", port, world_size=2, rank=0, backend="nccl")
        joined.join(timeout=120)
        versions: list[int] = []
        for _ in range(2):  # the first broadcast also sets up the NCCL communicator
            receiving = threading.Thread(
                target=lambda: versions.append(engine.update_weights_from_group(pickle.dumps(layouts)))
            )
            started = time.perf_counter()
            receiving.start()
            group.send_buckets(layouts, tensors, "cuda:1")
            receiving.join(timeout=120)
            elapsed = time.perf_counter() - started
    print(f"weight sync (NCCL broadcast GPU 1 -> GPU 0, {len(layouts)} buckets, warm): {1000 * elapsed:.1f} ms")
    assert versions == [before + 1, before + 2]
    assert_engine_samples_from(engine, model_dirs, now=1, before=0, version=before + 2)


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
