"""`GenerationBackend` on vLLM: a vLLM engine in this process, fed token ids, answering token ids and
the log-probabilities of the sampled tokens under the distribution sampled from.

The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so `update_weights` hands the
policy's tensors to the model's own `load_weights` on the same GPU, with no copy through the host.
Log-probabilities are vLLM's `processed_logprobs`: after temperature and top-p, as the trainer's
importance-sampling correction expects (see `GenerationResult`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from grpojob_trainer.generation.backend import (
    GenerationBackend,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)


class VLLMBackend(GenerationBackend):
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
    ) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        self.llm = LLM(
            model=str(model_path),
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            seed=seed,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=True,
            enforce_eager=enforce_eager,
        )
        self._tokenizer = self.llm.get_tokenizer()
        self._max_model_len = max_model_len
        self._lock = threading.Lock()
        self._weights_version = 0

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        if not requests:
            return []
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_token_ids)) for r in requests]
        sampling = [
            VllmSamplingParams(
                temperature=params.temperature,
                top_p=params.top_p,
                max_tokens=r.max_new_tokens,
                logprobs=0,  # the sampled token's log-probability only
                detokenize=False,
            )
            for r in requests
        ]
        with self._lock:
            outputs = self.llm.generate(prompts, sampling, use_tqdm=False)
            version = self._weights_version
        results = []
        for output in outputs:
            completion = output.outputs[0]
            tokens = tuple(completion.token_ids)
            log_probs = tuple(
                float(step[token].logprob) for step, token in zip(completion.logprobs or [], tokens, strict=True)
            )
            results.append(
                GenerationResult(
                    token_ids=tokens,
                    log_probs=log_probs,
                    finish_reason="length" if completion.finish_reason == "length" else "stop",
                    weights_version=version,
                )
            )
        return results

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load the policy's tensors (Hugging Face names) into the engine's model, then drop the prefix
        cache: cached keys and values were computed with the old weights."""
        weights = list(named_tensors)

        def load(model: torch.nn.Module) -> None:
            model.load_weights(iter(weights))

        with self._lock:
            self.llm.apply_model(load)
            self.llm.reset_prefix_cache()
            self._weights_version += 1
            return self._weights_version
