"""A tiny random causal LM for the trainer's unit tests (Qwen2-shaped, about 40k parameters)."""

from __future__ import annotations

import torch
import transformers


def tiny_causal_lm(seed: int = 0, tied: bool = False, intermediate_size: int = 64) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=intermediate_size,
        tie_word_embeddings=tied,
    )
    return transformers.AutoModelForCausalLM.from_config(config).eval()
