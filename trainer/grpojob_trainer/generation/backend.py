"""The generation backend interface: prompt token ids in, sampled token ids and log-probs out.

Every engine (transformers on the CPU, vLLM on GPUs) implements `GenerationBackend`; the HTTP server
(`grpojob_trainer.generation.app`) and the weight sync of the trainer only talk to this interface.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are sampled. The server fixes temperature and top-p (on-policy); requests only lower
    ``max_new_tokens``."""

    temperature: float
    """Logits are divided by this before the softmax; 0 means greedy decoding."""
    top_p: float
    """Nucleus sampling: sample from the smallest set of tokens whose probability reaches top_p."""
    max_new_tokens: int
    """Most tokens one call generates; hitting it gives finish reason ``length``."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt of a batch, with its own token budget (at most the server's ``max_new_tokens``)."""

    prompt_token_ids: tuple[int, ...]
    max_new_tokens: int


@dataclass(frozen=True)
class GenerationResult:
    """What one prompt produced.

    ``log_probs[i]`` is the log-probability of ``token_ids[i]`` under the distribution it was sampled
    from: softmax(logits / temperature) restricted to the top-p nucleus and renormalised (with
    temperature 0, greedy decoding, it is the log-softmax of the raw logits). With top_p = 1 this is
    exactly what a trainer computes from logits / temperature. ``token_ids`` ends with the
    end-of-sequence token when ``finish_reason`` is ``stop``.
    """

    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...]
    finish_reason: FinishReason
    weights_version: int
    """Version of the weights that generated every token of this result."""


class GenerationBackend(abc.ABC):
    """A batched generation engine whose weights the trainer replaces after every step.

    A backend sets ``_tokenizer`` and ``_max_model_len`` when it starts and increments
    ``_weights_version`` in `update_weights`.
    """

    _tokenizer: Any
    _max_model_len: int
    _weights_version: int = 0

    @property
    def tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer, chat template included."""
        return self._tokenizer

    @property
    def max_model_len(self) -> int:
        """Longest prompt plus generation, in tokens."""
        return self._max_model_len

    @property
    def weights_version(self) -> int:
        """0 for the weights loaded at start, incremented by each `update_weights`."""
        return self._weights_version

    @abc.abstractmethod
    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        """Generate for a batch of prompts (blocking), one result per request in order.

        Prompts must satisfy ``len(prompt) + max_new_tokens <= max_model_len``; the caller checks.
        """

    @abc.abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy the policy's parameters in (same architecture, names as in ``state_dict()``) and return
        the new weights version. Never runs while a batch is generating."""

    serves_lora: bool = False
    """Whether `update_adapter` works: the engine serves its base model with a LoRA adapter."""

    def update_adapter(self, config: dict[str, Any], named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Serve the base model with a LoRA adapter (PEFT's ``adapter_config.json`` as a dict, tensors under
        PEFT's file names) from now on; the new weights version."""
        raise NotImplementedError(f"{type(self).__name__} does not serve LoRA adapters")


class ContinuousBatchingBackend(GenerationBackend):
    """A backend whose engine batches requests itself as they arrive (vLLM): the server hands it each
    request on its own instead of gathering batches."""

    @abc.abstractmethod
    async def generate_one(self, request: GenerationRequest, params: SamplingParams) -> GenerationResult:
        """Generate for one prompt; awaitable from any event loop, concurrently with other calls."""
