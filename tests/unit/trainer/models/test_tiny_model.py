"""The tiny model command writes a standard, deterministic Hugging Face model directory."""

from __future__ import annotations

import json
import os

import pytest
import torch

from grpojob_trainer import cli
from grpojob_trainer.models import tiny
from grpojob_trainer.models.tiny import IM_END, SHAPES, TinyModelConfig, llama_config, write_tiny_model

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


def test_a_bf16_untied_model_is_written_in_bf16_with_its_own_output_layer_and_the_same_seed_repeats(tmp_path):
    from safetensors.torch import load_file

    config = TinyModelConfig(save_dtype="bfloat16", tie_word_embeddings=False, rope_theta=1e6)
    first = load_file(write_tiny_model(tmp_path / "a", config, device="cpu") / "model.safetensors")
    again = load_file(write_tiny_model(tmp_path / "b", config, device="cpu") / "model.safetensors")
    written = json.loads((tmp_path / "a" / "config.json").read_text())

    assert {tensor.dtype for tensor in first.values()} == {torch.bfloat16}
    assert not torch.equal(first["lm_head.weight"], first["model.embed_tokens.weight"])
    assert first.keys() == again.keys()
    for name, tensor in first.items():
        assert torch.equal(tensor, again[name]), name
    assert written["dtype"] == "bfloat16"
    assert written["tie_word_embeddings"] is False
    assert written["rope_parameters"]["rope_theta"] == 1e6


def test_the_qwen2_5_7b_shape_has_qwen2_5_7b_instructs_dimensions():
    config = llama_config(SHAPES["qwen2.5-7b"])

    assert config.hidden_size == 3584
    assert config.intermediate_size == 18944
    assert config.num_hidden_layers == 28
    assert config.num_attention_heads == 28
    assert config.num_key_value_heads == 4
    assert config.vocab_size == 152064
    assert config.max_position_embeddings == 32768
    assert config.tie_word_embeddings is False
    assert config.rope_parameters["rope_theta"] == 1_000_000
    assert config.rms_norm_eps == 1e-6
    assert SHAPES["qwen2.5-7b"].save_dtype == "bfloat16"


@pytest.mark.parametrize(
    ("shape", "at_least", "at_most", "tied"),
    [("qwen2.5-1.5b", 1.50e9, 1.60e9, True), ("qwen2.5-7b", 7.5e9, 7.7e9, False)],
)
def test_the_qwen_shapes_have_the_real_models_parameter_counts(shape, at_least, at_most, tied):
    from transformers import LlamaForCausalLM

    with torch.device("meta"):  # nothing allocated
        model = LlamaForCausalLM(llama_config(SHAPES[shape]))

    assert at_least < sum(parameter.numel() for parameter in model.parameters()) < at_most
    assert (model.lm_head.weight is model.model.embed_tokens.weight) is tied
    assert tiny.parameter_count(SHAPES[shape]) == sum(parameter.numel() for parameter in model.parameters())


def test_models_above_a_billion_parameters_are_initialised_on_the_gpu_when_there_is_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert tiny.default_device(SHAPES["qwen2.5-7b"]) == "cuda"
    assert tiny.default_device(SHAPES["qwen2.5-1.5b"]) == "cuda"
    assert tiny.default_device(SHAPES["small"]) == "cpu"

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert tiny.default_device(SHAPES["qwen2.5-7b"]) == "cpu"


def test_the_tiny_model_command_offers_every_named_shape(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["tiny-model", "--help"])
    usage = capsys.readouterr().out

    assert exit_.value.code == 0
    assert "{" + ",".join(SHAPES) + "}" in usage
    assert "qwen2.5-7b" in SHAPES
