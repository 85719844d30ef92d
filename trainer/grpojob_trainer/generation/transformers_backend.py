"""`GenerationBackend` on PyTorch/transformers: batched sampling with a KV cache, CPU or GPU."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from grpojob_trainer.generation.backend import (
    FinishReason,
    GenerationBackend,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)


def sample_next_tokens(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of ``logits`` (shape [batch, vocab]).

    Returns ``(token_ids [batch], log_probs [batch])`` where each log-prob is that of the sampled token
    under the distribution actually sampled from: softmax(logits / temperature), restricted to the
    top-p nucleus and renormalised. Temperature 0 is greedy decoding with the raw log-softmax.
    """
    logits = logits.float()
    if params.temperature == 0:
        log_probs = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
        return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)
    log_probs = torch.log_softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_log_probs, order = log_probs.sort(dim=-1, descending=True)
        cumulative = sorted_log_probs.exp().cumsum(dim=-1)
        # Keep a token when the probability mass before it is still below top_p (the first always stays).
        drop_sorted = (cumulative - sorted_log_probs.exp()) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        log_probs = torch.log_softmax(log_probs.masked_fill(drop, float("-inf")), dim=-1)
    tokens = torch.multinomial(log_probs.exp(), num_samples=1, generator=generator).squeeze(-1)
    return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)


class TransformersBackend(GenerationBackend):
    """Batched generation with a transformers causal LM (left padding, KV cache, float32 sampling).

    One batch runs at a time; `update_weights` waits for the running batch and vice versa.
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        max_model_len: int | None = None,
        device: str | None = None,
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self._tokenizer = AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)
        self.model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=dtype, local_files_only=True)
        self.model.to(self.device).eval()
        config_len = getattr(self.model.config, "max_position_embeddings", None) or 2048
        self._max_model_len = min(max_model_len or config_len, config_len)
        self.stop_token_ids = frozenset(_eos_ids(self.model, self._tokenizer))
        pad = self._tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else min(self.stop_token_ids)
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._lock = threading.Lock()
        self._weights_version = 0
        self._adapter_config: dict[str, Any] | None = None

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy tensors into the model's parameters and buffers by ``state_dict`` name."""
        with self._lock, torch.no_grad():
            targets = self.model.state_dict(keep_vars=True)
            for name, tensor in named_tensors:
                if name not in targets:
                    raise KeyError(f"update_weights: the generation model has no tensor named {name!r}")
                target = targets[name]
                if target.shape != tensor.shape:
                    raise ValueError(
                        f"update_weights: {name} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
                    )
                target.data.copy_(tensor.to(device=target.device, dtype=target.dtype))
            self._weights_version += 1
            return self._weights_version

    serves_lora = True

    def update_adapter(self, config: dict[str, Any], named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Serve the model with a LoRA adapter: the first one wraps the model in a `peft` model of that
        config, each one (the same config) replaces the adapter's tensors."""
        from peft import get_peft_config, get_peft_model, set_peft_model_state_dict

        with self._lock, torch.no_grad():
            if self._adapter_config is None:
                keys = {k: v for k, v in config.items() if k != "base_model_name_or_path"}
                self.model = get_peft_model(self.model, get_peft_config(keys)).eval()
                self._adapter_config = config
            elif config != self._adapter_config:
                raise ValueError("update_adapter: the adapter's config changed between versions")
            tensors = {name: tensor.to(self.device) for name, tensor in named_tensors}
            result = set_peft_model_state_dict(self.model, tensors)
            missing = [k for k in result.missing_keys if ".lora_" in k]
            if missing or result.unexpected_keys:
                raise KeyError(
                    f"update_adapter: the adapter does not fit the model (missing {missing[:3]}, unexpected "
                    f"{list(result.unexpected_keys)[:3]})"
                )
            self._weights_version += 1
            return self._weights_version

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        """Generate for every request in one batch (see `GenerationBackend.generate`)."""
        if not requests:
            return []
        with self._lock, torch.inference_mode():
            return self._generate_locked(requests, params)

    def _generate_locked(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        batch = len(requests)
        longest = max(len(r.prompt_token_ids) for r in requests)
        input_ids = torch.full((batch, longest), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((batch, longest), dtype=torch.long)
        for row, request in enumerate(requests):
            prompt = request.prompt_token_ids
            input_ids[row, longest - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention[row, longest - len(prompt) :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        budgets = [min(r.max_new_tokens, params.max_new_tokens) for r in requests]
        tokens: list[list[int]] = [[] for _ in requests]
        log_probs: list[list[float]] = [[] for _ in requests]
        finish: list[FinishReason | None] = [None] * batch

        output = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True)
        for _ in range(max(budgets)):
            next_tokens, next_log_probs = sample_next_tokens(output.logits[:, -1, :], params, self._generator)
            for row, (token, log_prob) in enumerate(zip(next_tokens.tolist(), next_log_probs.tolist(), strict=True)):
                if finish[row] is not None:
                    continue
                tokens[row].append(token)
                log_probs[row].append(log_prob)
                if token in self.stop_token_ids:
                    finish[row] = "stop"
                elif len(tokens[row]) >= budgets[row]:
                    finish[row] = "length"
            if all(f is not None for f in finish):
                break
            attention = torch.cat([attention, attention.new_ones((batch, 1))], dim=-1)
            positions = positions[:, -1:] + 1
            output = self.model(
                input_ids=next_tokens[:, None],
                attention_mask=attention,
                position_ids=positions,
                past_key_values=output.past_key_values,
                use_cache=True,
            )
        return [
            GenerationResult(tuple(t), tuple(lp), f or "length", self._weights_version)
            for t, lp, f in zip(tokens, log_probs, finish, strict=True)
        ]


def _eos_ids(model: torch.nn.Module, tokenizer) -> list[int]:
    """End-of-sequence ids from the generation config and the tokenizer."""
    ids: list[int] = []
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is not None:
        ids.extend([eos] if isinstance(eos, int) else list(eos))
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("the model has no end-of-sequence token (generation_config.eos_token_id or tokenizer eos)")
    return ids
