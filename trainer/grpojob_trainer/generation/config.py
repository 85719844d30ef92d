"""What an engine is started with, built once on the driver from the job's spec and handed to its Ray actor.

`EngineConfig.from_spec` reads every field an engine needs (the model, its lengths, its share of the GPU's
memory, its parallelism, a LoRA policy's rank, whether it sleeps while the policy trains, how its server samples)
from a validated `GRPOJobSpec`, so the actor takes typed values and validates nothing again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from grpojob_api import v1alpha1 as api
from grpojob_trainer.generation.app import EvaluationSampling, ServerConfig
from grpojob_trainer.generation.backend import SamplingParams


@dataclass(frozen=True)
class EngineConfig:
    """One generation engine: its backend and model, and the server in front of it."""

    backend: api.GenerationBackend
    model_path: str
    max_model_len: int
    memory_share: float
    """vLLM's fraction of its GPUs' memory (`GRPOJobSpec.engine_memory_share`)."""
    tensor_parallel_size: int
    lora_rank: int | None
    """A LoRA policy's rank: the engine serves LoRA adapters of it (None: a full fine-tune)."""
    sleeps: bool
    """A vLLM engine sharing the policy's GPU starts in sleep mode, to sleep while the policy trains
    (`GRPOJobSpec.engine_sleeps`)."""
    seed: int
    server: ServerConfig

    @classmethod
    def from_spec(
        cls,
        spec: api.GRPOJobSpec,
        model_path: str,
        *,
        seed: int,
        shares_gpu: bool,
        evaluation_token: str | None = None,
    ) -> EngineConfig:
        """The engine of ``spec`` loading ``model_path``; ``shares_gpu``: it shares its GPU with a policy rank;
        ``evaluation_token``: the secret that marks `spec.evaluation`'s requests, which sample with its parameters
        (none: every request samples with training's)."""
        generation, lora = spec.generation, spec.training.lora
        evaluation = None
        if spec.evaluation is not None and evaluation_token is not None:
            asked = spec.evaluation
            sampling = SamplingParams(asked.temperature, asked.top_p, spec.evaluation_max_new_tokens)
            evaluation = EvaluationSampling(evaluation_token, sampling)
        server = ServerConfig(
            served_model_name=spec.model.served_model_name,
            sampling=SamplingParams(generation.temperature, generation.top_p, generation.max_new_tokens),
            evaluation=evaluation,
        )
        return cls(
            backend=generation.backend,
            model_path=model_path,
            max_model_len=generation.max_model_len,
            memory_share=spec.engine_memory_share(shares_gpu),
            tensor_parallel_size=max(1, generation.gpus_per_replica),
            lora_rank=lora.rank if lora is not None else None,
            sleeps=spec.engine_sleeps(shares_gpu),
            seed=seed,
            server=server,
        )

    def for_engine(self, index: int) -> EngineConfig:
        """The config of engine ``index`` of a group: each samples with a seed of its own (``seed + index``)."""
        return dataclasses.replace(self, seed=self.seed + index)
