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
from grpojob_trainer.generation.config import EngineConfig

NamedTensors = list[tuple[str, torch.Tensor]]
log = logging.getLogger(__name__)

MERGED_SYNC_ENV = "GRPOJOB_LORA_MERGED_SYNC"
"""Set to ``1`` in the trainer's environment: a LoRA policy's vLLM engines start without LoRA and take the
adapter merged into the base each step, as when vLLM cannot serve LoRA for the model. For comparing the
two syncs (`benchmarks/gpu_grpo.py`), or for a model whose LoRA kernels cost more in generation than the
full weights' sync does."""


class GenerationWorker:
    """One generation engine and its HTTP server (a Ray actor on a `generation` worker)."""

    def __init__(self, config: EngineConfig, host: str, port: int | None) -> None:
        """Start the engine ``config`` describes and its server on ``host``:``port`` (a free port when None)."""
        from grpojob_trainer.generation.backend import GenerationBackend
        from grpojob_trainer.generation.server import GenerationServer
        from grpojob_trainer.generation.transformers_backend import TransformersBackend

        backend: GenerationBackend
        if config.backend == api.GenerationBackend.VLLM:
            backend = start_vllm(config)
        else:
            backend = TransformersBackend(config.model_path, max_model_len=config.max_model_len, seed=config.seed)
        self.server = GenerationServer(backend, config.server, host=host, port=port).start()

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


def start_vllm(config: EngineConfig) -> Any:
    """The vLLM engine ``config`` describes; for a LoRA policy (``config.lora_rank``), one that serves LoRA
    adapters, or, when vLLM cannot serve LoRA for this model, one without (the policy then sends merged weights:
    logged)."""
    from grpojob_trainer.generation.vllm_backend import VLLMBackend

    def start(rank: int | None) -> VLLMBackend:
        return VLLMBackend(
            config.model_path,
            max_model_len=config.max_model_len,
            gpu_memory_utilization=config.memory_share,
            tensor_parallel_size=config.tensor_parallel_size,
            seed=config.seed,
            lora_rank=rank,
            enable_sleep_mode=config.sleeps,
        )

    lora_rank = config.lora_rank
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
