"""The tiny model command writes a standard, deterministic Hugging Face model directory."""

from __future__ import annotations

import os

import torch

from grpojob_trainer.models.tiny import IM_END, TinyModelConfig, write_tiny_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_the_same_seed_writes_the_same_weights_and_auto_classes_load_them(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    first = AutoModelForCausalLM.from_pretrained(write_tiny_model(tmp_path / "a"), local_files_only=True)
    again = AutoModelForCausalLM.from_pretrained(write_tiny_model(tmp_path / "b"), local_files_only=True)
    other = AutoModelForCausalLM.from_pretrained(
        write_tiny_model(tmp_path / "c", TinyModelConfig(seed=1)), local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "a", local_files_only=True)

    for name, tensor in first.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name
    assert not torch.equal(first.model.embed_tokens.weight, other.model.embed_tokens.weight)
    assert 500_000 < sum(p.numel() for p in first.parameters()) < 3_000_000
    assert tokenizer.eos_token == IM_END
    assert tokenizer.convert_tokens_to_ids(IM_END) == first.generation_config.eos_token_id
    assert first.config.vocab_size == len(tokenizer)
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )


def test_a_padded_vocabulary_gives_real_model_sized_embeddings_and_decodes_fillers():
    from grpojob_trainer.models.tiny import build_tokenizer, build_vocab

    tokenizer = build_tokenizer(vocab_size=1000)
    assert len(tokenizer) == 1000 == len(build_vocab(1000))
    text = "What is 2+3?"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert max(ids) < len(build_vocab())  # text never encodes to a filler
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode([999]).startswith("<|filler_")
