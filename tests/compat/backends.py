"""Generation backends for the compatibility suite, behind our real generation server.

`RecordingBackend` keeps every prompt and result another backend produced, so a test can compare what
came back through NeMo Gym with what our server generated. `ScriptedBackend` writes the model's text
from a script (the tiny random model never calls a tool by chance): the text is tokenised by the
model's real tokenizer and ends with its end-of-sequence token, and each token's log-prob is a fixed,
distinct number.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from grpojob_trainer.generation.backend import (
    GenerationBackend,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)


class RecordingBackend(GenerationBackend):
    """Another backend, with a record of every ``(prompt token ids, result)`` it produced."""

    def __init__(self, inner: GenerationBackend) -> None:
        self.inner = inner
        self._tokenizer = inner.tokenizer
        self._max_model_len = inner.max_model_len
        self._lock = threading.Lock()
        self.generated: list[tuple[tuple[int, ...], GenerationResult]] = []

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        results = self.inner.generate(requests, params)
        with self._lock:
            self.generated += [(r.prompt_token_ids, result) for r, result in zip(requests, results, strict=True)]
        return results

    def update_weights(self, named_tensors: Iterable) -> int:
        self._weights_version = self.inner.update_weights(named_tensors)
        return self._weights_version

    def sequences(self) -> dict[tuple[int, ...], GenerationResult]:
        """Each recorded call as ``prompt + generated ids`` → its result."""
        with self._lock:
            return {prompt + result.token_ids: result for prompt, result in self.generated}


class ScriptedBackend(GenerationBackend):
    """Answers each prompt with ``script(prompt text)``, tokenised by the model's tokenizer, then EOS."""

    def __init__(self, model_dir: str | Path, script: Callable[[str], str], max_model_len: int = 4096) -> None:
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self._max_model_len = max_model_len
        self.script = script

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        return [self._answer(request) for request in requests]

    def update_weights(self, named_tensors: Iterable) -> int:
        self._weights_version += 1
        return self._weights_version

    def _answer(self, request: GenerationRequest) -> GenerationResult:
        text = self.script(self._tokenizer.decode(list(request.prompt_token_ids)))
        ids = [*self._tokenizer(text, add_special_tokens=False)["input_ids"], self._tokenizer.eos_token_id]
        finish = "stop" if len(ids) <= request.max_new_tokens else "length"
        ids = ids[: request.max_new_tokens]
        log_probs = tuple(-(index + 1) / 64 for index in range(len(ids)))
        return GenerationResult(tuple(ids), log_probs, finish, self._weights_version)
