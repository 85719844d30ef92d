"""`GenerationBackend` on vLLM's async engine: continuous batching, token ids in, token ids and the
log-probabilities of the sampled tokens out.

The engine (`AsyncLLM`) runs its scheduler and GPU workers in processes of its own; this backend drives
it from an event loop on a thread of its own, so the HTTP server's loop, the Ray actor's thread and
tests can all call in. Each request goes to the engine as it arrives (no batching window): vLLM batches
continuously. Log-probabilities are vLLM's `processed_logprobs`: after temperature and top-p, as the
trainer's importance-sampling correction expects (see `GenerationResult`).

Weights reach the GPU workers through `WeightSyncExtension` (`vllm_extension`): pickled CPU tensors, CUDA
IPC handles of buckets on the same GPU, or buckets broadcast over NCCL from the policy's GPU. After a
load the prefix cache is dropped: its keys and values were computed with the old weights.

With ``lora_rank`` the engine serves the base model with LoRA enabled, and a LoRA policy's adapter
arrives by the same paths (`update_adapter*`): each version is served from memory (registered, or
written over the places of the version before the previous one) and every request after it names that
version; requests before the first adapter run on the base.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import threading
import uuid
from collections.abc import Coroutine, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from grpojob_trainer.generation.backend import (
    ContinuousBatchingBackend,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)
from grpojob_trainer.generation.engine_start import EngineStartWatch

WORKER_EXTENSION = "grpojob_trainer.generation.vllm_extension.WeightSyncExtension"
T = TypeVar("T")

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The `max_lora_rank` values vLLM accepts: an engine is started with the smallest that holds the rank."""


def max_lora_rank(rank: int) -> int:
    """The smallest of `LORA_RANKS` at least ``rank``."""
    for allowed in LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"vLLM serves LoRA adapters of rank up to {LORA_RANKS[-1]}, got {rank}")


class VLLMBackend(ContinuousBatchingBackend):
    """One vLLM engine (tensor-parallel over ``tensor_parallel_size`` GPUs)."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        max_model_len: int,
        gpu_memory_utilization: float = 0.9,
        tensor_parallel_size: int = 1,
        dtype: str = "bfloat16",
        seed: int = 0,
        enforce_eager: bool = False,
        lora_rank: int | None = None,
        enable_sleep_mode: bool = False,
    ) -> None:
        # Forking a process whose CPU thread pools have run (model writing, tokenizing) can deadlock the
        # child: the engine's processes are spawned.
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        from transformers import AutoTokenizer
        from vllm import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        self.tensor_parallel_size = tensor_parallel_size
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine-loop", daemon=True)
        self._thread.start()
        engine_args = AsyncEngineArgs(
            model=str(model_path),
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            seed=seed,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=True,
            enforce_eager=enforce_eager,
            worker_extension_cls=WORKER_EXTENSION,
            disable_log_stats=True,
            enable_sleep_mode=enable_sleep_mode,
            **lora_engine_args(lora_rank),
        )

        async def start() -> Any:
            # Rollouts are batch work: the offline engine's scheduler limits (on an H200: 1024 sequences,
            # 16384 tokens per step), not the engine-context defaults (128 sequences, 2048 tokens), which
            # halved throughput at 256 concurrent rollouts.
            return AsyncLLM.from_engine_args(engine_args, usage_context=UsageContext.LLM_CLASS)

        watch = EngineStartWatch.now()
        try:
            self.async_llm = self._run(start())
            """vLLM's own engine (`AsyncLLM`), which this backend, one of our generation engines, drives."""
        except Exception as error:  # vLLM's says "see root cause above": the cause, in one line
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            explained = watch.explain(error)
            if explained is error:
                raise
            raise explained from error
        self._tokenizer = AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)
        self._max_model_len = max_model_len
        self._weights_version = 0
        self.serves_lora = lora_rank is not None
        self.sleeps = enable_sleep_mode
        self._adapter_version: int | None = None
        """The newest adapter version registered (None: the base model's weights, no adapter yet)."""
        self.adapters_written_in_place = 0
        """Adapter versions every worker wrote over an older one's places instead of registering them
        (`vllm_extension.InPlaceAdapter`)."""

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the engine's loop and wait for it (from any thread but that loop's)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    # ----------------------------------------------------------------------------------------------
    # generation

    async def _generate_on_engine_loop(self, request: GenerationRequest, params: SamplingParams) -> GenerationResult:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        sampling = VllmSamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=request.max_new_tokens,
            logprobs=0,  # the sampled token's log-probability only
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        from grpojob_trainer.generation.vllm_extension import adapter_request

        version, adapter = self._weights_version, self._adapter_version
        lora = adapter_request(adapter) if adapter is not None else None
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_token_ids))
        final = None
        async for output in self.async_llm.generate(prompt, sampling, request_id=uuid.uuid4().hex, lora_request=lora):
            final = output
        if final is None:
            raise RuntimeError("the vLLM engine returned no output")
        completion = final.outputs[0]
        tokens = tuple(completion.token_ids)
        log_probs = tuple(
            float(step[token].logprob) for step, token in zip(completion.logprobs or [], tokens, strict=True)
        )
        return GenerationResult(
            token_ids=tokens,
            log_probs=log_probs,
            finish_reason="length" if completion.finish_reason == "length" else "stop",
            weights_version=version,
        )

    async def generate_one(self, request: GenerationRequest, params: SamplingParams) -> GenerationResult:
        future = asyncio.run_coroutine_threadsafe(self._generate_on_engine_loop(request, params), self._loop)
        return await asyncio.wrap_future(future)

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        futures = [
            asyncio.run_coroutine_threadsafe(self._generate_on_engine_loop(r, params), self._loop) for r in requests
        ]
        return [future.result() for future in futures]

    # ----------------------------------------------------------------------------------------------
    # weights (between steps, when no request is in flight)

    def _load(self, method: str, *args: Any) -> int:
        async def load() -> list[Any]:
            results = await self.async_llm.collective_rpc(method, args=args)
            await self.async_llm.reset_prefix_cache()
            return results

        self._run(load())
        self._weights_version += 1
        return self._weights_version

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load tensors sent by value (moved to the CPU, pickled): the path without a GPU in common."""
        named = [(name, tensor.detach().cpu()) for name, tensor in named_tensors]
        return self._load("grpojob_load_tensors", pickle.dumps(named))

    def update_weights_ipc(self, payload: bytes) -> int:
        """Load buckets the policy shares by CUDA IPC (see `PolicyWorker.share_weights_ipc`)."""
        return self._load("grpojob_load_ipc", payload)

    def _add_adapter(self, method: str, config: dict[str, Any], payload: bytes) -> int:
        if not self.serves_lora:
            raise RuntimeError("this engine was started without LoRA: it takes merged weights, not adapters")
        version = self._weights_version + 1
        in_place = self._run(self.async_llm.collective_rpc(method, args=(version, config, payload)))
        self._adapter_version = self._weights_version = version
        self.adapters_written_in_place += all(in_place)
        return version

    def update_adapter(self, config: dict[str, Any], named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Register a LoRA adapter sent by value (CPU tensors, PEFT's names) as the next version."""
        named = [(name, tensor.detach().cpu()) for name, tensor in named_tensors]
        return self._add_adapter("grpojob_add_adapter_tensors", config, pickle.dumps(named))

    def update_adapter_ipc(self, config: dict[str, Any], payload: bytes) -> int:
        """Register a LoRA adapter whose buckets the policy shares by CUDA IPC."""
        return self._add_adapter("grpojob_add_adapter_ipc", config, payload)

    def update_adapter_from_group(self, config: dict[str, Any], layouts_payload: bytes) -> int:
        """Receive a LoRA adapter's buckets from the broadcast group and register it."""
        return self._add_adapter("grpojob_add_adapter_from_group", config, layouts_payload)

    def join_weight_group(self, host: str, port: int, world_size: int, rank: int) -> None:
        """Join the policy's NCCL broadcast group (tensor parallelism 1: one worker, one rank)."""
        if self.tensor_parallel_size != 1:
            raise NotImplementedError("NCCL weight sync supports engines of tensor-parallel size 1")
        self._run(self.async_llm.collective_rpc("grpojob_join_weight_group", args=(host, port, world_size, rank)))

    def update_weights_from_group(self, layouts_payload: bytes) -> int:
        """Receive and load the policy's broadcast buckets (pickled `BucketLayout` list)."""
        return self._load("grpojob_load_from_group", layouts_payload)

    def sleep(self, level: int) -> int:
        """Free the engine's GPU memory between batches (no request in flight): level 1 moves the weights to
        host memory and drops the KV cache, level 2 drops both (new weights must be loaded after
        `wake_up` of the weights). Returns the GPU's free bytes after it, as the engine's worker sees them."""
        if not self.sleeps:
            raise RuntimeError("this engine was started without sleep mode")
        self._run(self.async_llm.sleep(level))
        return min(self._run(self.async_llm.collective_rpc("grpojob_free_bytes")))

    def wake_up(self, tags: list[str]) -> None:
        """Take back the memory of ``tags`` (``weights``, ``kv_cache``) after `sleep`; the KV cache comes back
        empty, and so does the prefix cache."""

        async def wake() -> None:
            await self.async_llm.wake_up(tags)
            if "kv_cache" in tags:
                await self.async_llm.reset_prefix_cache()

        self._run(wake())

    def device_uuids(self) -> list[str]:
        """The UUIDs of the engine's GPUs."""
        return self._run(self.async_llm.collective_rpc("grpojob_device_uuid"))

    def shutdown(self) -> None:
        self.async_llm.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)


def lora_engine_args(lora_rank: int | None) -> dict[str, Any]:
    """vLLM engine arguments that serve LoRA adapters of rank ``lora_rank`` (none without one): the newest
    two versions in a batch, as `vllm_extension.ADAPTERS_KEPT` keeps them."""
    from grpojob_trainer.generation.vllm_extension import ADAPTERS_KEPT

    if lora_rank is None:
        return {}
    return {
        "enable_lora": True,
        "max_lora_rank": max_lora_rank(lora_rank),
        "max_loras": ADAPTERS_KEPT,
        "max_cpu_loras": ADAPTERS_KEPT + 1,
    }
