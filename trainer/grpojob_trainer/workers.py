"""The trainer's Ray actors: generation engines and the policy, each placed on its worker group.

A `generation` pod runs one `GenerationWorker` (an engine behind the OpenAI-compatible server on port
8000, which the `<job>-generation` Service selects); a `policy` pod runs the `PolicyWorker`. Placement
uses the custom Ray resources the RayCluster's groups declare (`{"generation": 1}`, `{"policy": 1}`);
`grpojob run` declares the same resources on its local Ray head. Weights travel policy → engines
through the Ray object store (one put, every engine reads it): the CPU path. Bucketed NCCL broadcast
is the GPU path (not built here).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from grpojob_api import v1alpha1 as api
from grpojob_trainer.samples import TrainingSample

NamedTensors = list[tuple[str, torch.Tensor]]


class GenerationWorker:
    """One generation engine and its HTTP server (a Ray actor on a `generation` worker)."""

    def __init__(self, spec: dict[str, Any], model_path: str, host: str, port: int | None, seed: int) -> None:
        from grpojob_trainer.generation.app import ServerConfig
        from grpojob_trainer.generation.backend import GenerationBackend, SamplingParams
        from grpojob_trainer.generation.server import GenerationServer
        from grpojob_trainer.generation.transformers_backend import TransformersBackend

        job_spec = api.GRPOJobSpec.model_validate(spec)
        generation = job_spec.generation
        backend: GenerationBackend
        if generation.backend == api.GenerationBackend.VLLM:
            from grpojob_trainer.generation.vllm_backend import VLLMBackend

            backend = VLLMBackend(
                model_path,
                max_model_len=generation.max_model_len,
                gpu_memory_utilization=generation.gpu_memory_utilization,
                tensor_parallel_size=max(1, generation.gpus_per_replica),
                seed=seed,
            )
        else:
            backend = TransformersBackend(model_path, max_model_len=generation.max_model_len, seed=seed)
        config = ServerConfig(
            served_model_name=job_spec.model.served_model_name,
            sampling=SamplingParams(generation.temperature, generation.top_p, generation.max_new_tokens),
        )
        self.server = GenerationServer(backend, config, host=host, port=port).start()

    def base_url(self) -> str:
        return self.server.base_url

    def update_weights(self, named_tensors: NamedTensors) -> int:
        return self.server.update_weights(named_tensors)

    def stop(self) -> None:
        self.server.stop()


class PolicyWorker:
    """The policy being trained, its optimizer and its checkpoints (a Ray actor on a `policy` worker)."""

    def __init__(self, spec: dict[str, Any], model_path: str, seed: int) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from grpojob_trainer.policy import PolicyTrainer

        torch.manual_seed(seed)
        self.spec = api.GRPOJobSpec.model_validate(spec)
        tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, local_files_only=True)
        if torch.cuda.is_available():  # the GPUs Ray gave this actor (none on a CPU worker)
            model.to("cuda")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.trainer = PolicyTrainer.from_spec(model, self.spec, pad_token_id=pad)

    def train_step(self, samples: list[TrainingSample]) -> dict[str, float]:
        return self.trainer.train_step(samples)

    def weights(self) -> NamedTensors:
        """The parameters to push to the engines (detached copies on the CPU)."""
        return [(name, tensor.detach().cpu().clone()) for name, tensor in self.trainer.model.state_dict().items()]

    def save(self, directory: str, step: int, data_position: dict[str, Any], config: dict[str, Any], keep: int) -> str:
        from grpojob_trainer.checkpoint import save_checkpoint

        path = save_checkpoint(
            directory,
            step=step,
            model=self.trainer.model,
            optimizer=self.trainer.optimizer,
            data_position=data_position,
            config=config,
            keep=keep,
        )
        return str(path)

    def resume(self, directory: str) -> tuple[int, dict[str, Any]] | None:
        """Load the newest checkpoint in ``directory``; (its step, its data position), or None."""
        from grpojob_trainer.checkpoint import latest_checkpoint, load_checkpoint

        path = latest_checkpoint(directory) if Path(directory).exists() else None
        if path is None:
            return None
        info = load_checkpoint(path, model=self.trainer.model, optimizer=self.trainer.optimizer)
        return info.step, info.data_position


def sync_weights(policy: Any, engines: list[Any]) -> dict[str, float]:
    """Push the policy's weights to every engine through the object store; wait until all have them."""
    import ray

    started = time.perf_counter()
    weights = policy.weights.remote()
    versions = ray.get([engine.update_weights.remote(weights) for engine in engines])
    return {"weight_sync/seconds": time.perf_counter() - started, "weight_sync/version": float(min(versions))}
