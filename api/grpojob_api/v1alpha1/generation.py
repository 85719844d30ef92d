"""Generation: `spec.generation` (the engines and their sampling parameters) and where the engines run beside
the policy (`spec.placement`), with their share of a GPU's memory.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import (
    ConfigDict,
    Field,
    model_validator,
)

from grpojob_api.v1alpha1.base import (
    ApiModel,
    cel,
    cel_rules,
    given,
)
from grpojob_api.v1alpha1.pods import WorkerResources


class GenerationBackend(StrEnum):
    VLLM = "vllm"
    TRANSFORMERS = "transformers"


_VLLM_NEEDS_GPUS = "spec.generation.backend: vllm needs spec.generation.gpusPerReplica of 1 or more"
_NEW_TOKENS_FIT = (
    "spec.generation.maxNewTokens must be smaller than spec.generation.maxModelLen to leave room for the prompt"
)


class GenerationSpec(ApiModel):
    """The generation engines (one per `generation` Ray worker) and the sampling parameters.

    Sampling parameters are enforced on-policy: a request that leaves out temperature or top-p samples with
    these, and one whose temperature or top-p differ is refused.
    """

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                given("maxNewTokens", "maxModelLen") + "self.maxNewTokens < self.maxModelLen",
                _NEW_TOKENS_FIT,
                ".maxNewTokens",
            ),
            cel(
                given("backend", "gpusPerReplica") + "(self.backend != 'vllm' || self.gpusPerReplica >= 1)",
                _VLLM_NEEDS_GPUS,
                ".backend",
            ),
        )
    )

    backend: GenerationBackend = GenerationBackend.TRANSFORMERS
    """Engine behind the OpenAI-compatible server: `transformers` (CPU or GPU) or `vllm` (GPUs only)."""
    replicas: int = Field(default=1, ge=1, le=256)
    """Number of generation engines (pods of the `generation` worker group; colocated, one beside each policy
    rank, so as many as `spec.training.replicas`)."""
    gpus_per_replica: int = Field(default=1, ge=0, le=8)
    """GPUs per engine, which is also vLLM's tensor-parallel size (0 runs on CPU)."""
    gpu_memory_utilization: float | None = Field(default=None, gt=0.0, le=1.0)
    """Fraction of GPU memory vLLM may use. Unset: 0.9 on GPUs of its own (`spec.placement: split`), 0.35 on
    a GPU it shares with a policy rank (`colocated`), which leaves the rest to training (the share the 1.5B
    and 7B LoRA benchmarks ran at)."""
    max_model_len: int = Field(default=4096, ge=16, le=1_048_576)
    """Longest prompt plus generation, in tokens."""
    temperature: float = Field(default=1.0, gt=0.0, le=2.0)
    """Sampling temperature used for every rollout; above 0: GRPO trains on sampled rollouts, and greedy
    decoding has no sampling distribution to compute log-probabilities of."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus-sampling top-p used for every rollout."""
    max_new_tokens: int = Field(default=1024, ge=1, le=1_048_576)
    """Most tokens one model call may generate."""
    sleep_while_training: bool | None = None
    """Whether a vLLM engine that shares its GPU with the policy (`spec.placement: colocated`) sleeps while the
    policy trains (vLLM's sleep mode), so training may use the GPU's memory beyond what the engine leaves;
    it wakes for the weight sync. Unset: it sleeps when the policy sends full weights, which replace its own
    (it drops them with its KV cache: the 1.5B step took 0.86 of the time awake on an H200), and stays awake
    for a LoRA adapter (the base it must keep would go to host memory and back: 1.6 s more per 7B step).
    `true` makes a LoRA policy's engine sleep too. No effect on an engine with GPUs of its own."""
    resources: WorkerResources = Field(default_factory=WorkerResources)
    """CPU, memory and shared memory of each `generation` worker pod (split placement; colocated workers
    take `spec.training.resources`)."""

    @model_validator(mode="after")
    def _new_tokens_fit(self) -> GenerationSpec:
        if self.max_new_tokens >= self.max_model_len:
            raise ValueError(f"{_NEW_TOKENS_FIT} ({self.max_new_tokens} >= {self.max_model_len})")
        return self

    @model_validator(mode="after")
    def _vllm_needs_gpus(self) -> GenerationSpec:
        if self.backend == GenerationBackend.VLLM and self.gpus_per_replica == 0:
            raise ValueError(_VLLM_NEEDS_GPUS)
        return self


SPLIT_ENGINE_MEMORY_SHARE = 0.9
COLOCATED_ENGINE_MEMORY_SHARE = 0.35
MAX_COLOCATED_ENGINE_MEMORY_SHARE = 0.7
"""The most of a GPU an engine may take beside a policy rank, which keeps its weights, gradients and optimizer
state on the GPU while the engine generates."""


class Placement(StrEnum):
    """Where the generation engines run relative to the policy's ranks."""

    COLOCATED = "colocated"
    """Each GPU holds one engine and one policy rank, in one worker group: the new weights (or the adapter)
    reach the engine by CUDA IPC inside the pod, and the engine sleeps while the policy trains
    (`spec.generation.sleepWhileTraining`). Half the GPUs of `split` for on-policy GRPO, where engine and
    policy take turns anyway."""
    SPLIT = "split"
    """Engines on GPUs of their own (the `generation` worker group) and the policy on others (`policy`):
    weights travel by NCCL broadcast. For asynchronous GRPO (`spec.grpo.maxOffPolicySteps` >= 1), which
    generates while the policy trains, and for engines with more GPUs than a rank (tensor parallel)."""
