"""Generation: the backend interface, the transformers backend and the OpenAI-compatible server."""

from grpojob_trainer.generation.backend import (
    FinishReason,
    GenerationBackend,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)

__all__ = ["FinishReason", "GenerationBackend", "GenerationRequest", "GenerationResult", "SamplingParams"]
