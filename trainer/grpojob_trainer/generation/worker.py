"""The generation engine as a Ray actor: one `GenerationWorker` per `generation` worker.

A `generation` pod runs one `GenerationWorker` (an engine behind the OpenAI-compatible server on port
8000, which the `<job>-generation` Service selects), placed with the custom Ray resource its group declares
(`{"generation": 1}`; `grpojob run` declares the same resource on its local Ray head). It offers the
receiving end of every weight path (object store, CUDA IPC, NCCL broadcast: `grpojob_trainer.weight_sync`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from grpojob_api import v1alpha1 as api

NamedTensors = list[tuple[str, torch.Tensor]]
log = logging.getLogger(__name__)

MERGED_SYNC_ENV = "GRPOJOB_LORA_MERGED_SYNC"
"""Set to ``1`` in the trainer's environment: a LoRA policy's vLLM engines start without LoRA and take the
adapter merged into the base each step, as when vLLM cannot serve LoRA for the model. For comparing the
two syncs (`benchmarks/gpu_grpo.py`), or for a model whose LoRA kernels cost more in generation than the
full weights' sync does."""


class GenerationWorker:
    """One generation engine and its HTTP server (a Ray actor on a `generation` worker)."""

    def __init__(
        self,
        spec: dict[str, Any],
        model_path: str,
        host: str,
        port: int | None,
        seed: int,
        evaluation_token: str | None = None,
        shares_gpu: bool = False,
    ) -> None:
        """``evaluation_token``: the secret that marks the requests of `spec.evaluation`'s rollouts, which
        sample with its parameters (none: every request samples with training's). ``shares_gpu``: the engine
        shares its GPU with the policy, so a vLLM engine starts in sleep mode when it is to sleep while the
        policy trains (`GRPOJobSpec.engine_sleeps`)."""
        from grpojob_trainer.generation.app import EvaluationSampling, ServerConfig
        from grpojob_trainer.generation.backend import GenerationBackend, SamplingParams
        from grpojob_trainer.generation.server import GenerationServer
        from grpojob_trainer.generation.transformers_backend import TransformersBackend

        job_spec = api.GRPOJobSpec.model_validate(spec)
        generation = job_spec.generation
        backend: GenerationBackend
        if generation.backend == api.GenerationBackend.VLLM:
            lora = job_spec.training.lora
            sleep_mode = job_spec.engine_sleeps(shares_gpu)
            backend = start_vllm(
                job_spec,
                model_path,
                seed,
                lora.rank if lora is not None else None,
                sleep_mode,
                job_spec.engine_memory_share(shares_gpu),
            )
        else:
            backend = TransformersBackend(model_path, max_model_len=generation.max_model_len, seed=seed)
        evaluation = None
        if job_spec.evaluation is not None and evaluation_token is not None:
            spec_of = job_spec.evaluation
            sampling = SamplingParams(spec_of.temperature, spec_of.top_p, job_spec.evaluation_max_new_tokens)
            evaluation = EvaluationSampling(evaluation_token, sampling)
        config = ServerConfig(
            served_model_name=job_spec.model.served_model_name,
            sampling=SamplingParams(generation.temperature, generation.top_p, generation.max_new_tokens),
            evaluation=evaluation,
        )
        self.server = GenerationServer(backend, config, host=host, port=port).start()

    def base_url(self) -> str:
        return self.server.base_url

    def weight_sync_info(self) -> dict[str, Any]:
        """Which weight paths this engine offers: its backend, for vLLM its GPUs' UUIDs, whether it serves
        LoRA adapters and whether it can sleep while the policy trains."""
        from grpojob_trainer.generation.vllm_backend import VLLMBackend

        backend = self.server.backend
        if isinstance(backend, VLLMBackend):
            uuids = backend.device_uuids()
            return {"backend": "vllm", "device_uuids": uuids, "lora": backend.serves_lora, "sleeps": backend.sleeps}
        return {"backend": "transformers", "device_uuids": [], "lora": backend.serves_lora, "sleeps": False}

    def sleep(self, level: int) -> int:
        """Free the engine's GPU memory while the policy trains (`VLLMBackend.sleep`); the GPU's free bytes."""
        return self.server.backend.sleep(level)

    def wake_up(self, tags: list[str]) -> None:
        self.server.backend.wake_up(tags)

    def update_weights(self, named_tensors: NamedTensors) -> int:
        return self.server.update_weights(named_tensors)

    def update_adapter(self, config: dict[str, Any], named_tensors: NamedTensors) -> int:
        return self.server.backend.update_adapter(config, named_tensors)

    def update_adapter_ipc(self, config: dict[str, Any], payload: bytes) -> int:
        return self.server.backend.update_adapter_ipc(config, payload)

    def update_adapter_from_group(self, config: dict[str, Any], layouts_payload: bytes) -> int:
        return self.server.backend.update_adapter_from_group(config, layouts_payload)

    def update_weights_ipc(self, payload: bytes) -> int:
        return self.server.backend.update_weights_ipc(payload)

    def join_weight_group(self, host: str, port: int, world_size: int, rank: int) -> None:
        self.server.backend.join_weight_group(host, port, world_size, rank)

    def update_weights_from_group(self, layouts_payload: bytes) -> int:
        return self.server.backend.update_weights_from_group(layouts_payload)


def start_vllm(
    spec: api.GRPOJobSpec,
    model_path: str,
    seed: int,
    lora_rank: int | None,
    sleep_mode: bool = False,
    memory_share: float = api.SPLIT_ENGINE_MEMORY_SHARE,
) -> Any:
    """The job's vLLM engine, taking ``memory_share`` of its GPUs' memory; with ``lora_rank`` (a LoRA
    policy), one that serves LoRA adapters, or, when vLLM cannot serve LoRA for this model, one without (the
    policy then sends merged weights: logged); with ``sleep_mode``, one that can sleep while the policy
    trains."""
    from grpojob_trainer.generation.vllm_backend import VLLMBackend

    generation = spec.generation

    def start(rank: int | None) -> VLLMBackend:
        return VLLMBackend(
            model_path,
            max_model_len=generation.max_model_len,
            gpu_memory_utilization=memory_share,
            tensor_parallel_size=max(1, generation.gpus_per_replica),
            seed=seed,
            lora_rank=rank,
            enable_sleep_mode=sleep_mode,
        )

    if lora_rank is None:
        return start(None)
    if os.environ.get(MERGED_SYNC_ENV) == "1":
        log.warning("%s=1: the engine serves no LoRA adapters; the policy sends merged weights", MERGED_SYNC_ENV)
        return start(None)
    try:
        return start(lora_rank)
    except (ValueError, NotImplementedError) as error:
        if "lora" not in str(error).lower():
            raise
        log.warning("vLLM cannot serve LoRA adapters for this model (%s): the policy sends merged weights", error)
        return start(None)
