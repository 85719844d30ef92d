"""Generation: the backend interface, the transformers and vLLM backends, the OpenAI server and its Ray worker."""

from grpojob_trainer.generation.backend import (
    FinishReason,
    GenerationBackend,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)

__all__ = ["FinishReason", "GenerationBackend", "GenerationRequest", "GenerationResult", "SamplingParams"]
