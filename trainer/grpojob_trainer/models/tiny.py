"""A tiny, randomly initialised causal LM written as a standard Hugging Face model directory.

`python -m grpojob_trainer.models.tiny OUT_DIR [--seed S]` writes weights (safetensors), config,
generation config and a character-level tokenizer with a ChatML-style chat template, all built
offline. The directory loads with ``AutoModelForCausalLM.from_pretrained(OUT_DIR)`` and
``AutoTokenizer.from_pretrained(OUT_DIR)``. The same seed writes the same weights.

Chat format (what the template renders and what the generation server parses)::

    <|im_start|>system\\n{system text}{tools block}<|im_end|>\\n
    <|im_start|>user\\n{text}<|im_end|>\\n
    <|im_start|>assistant\\n{text}<tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>\\n
    <|im_start|>tool\\n<tool_response>{output}</tool_response><|im_end|>\\n

``<|im_end|>`` is the end-of-sequence token. Tool calls are JSON objects between ``<tool_call>`` and
``</tool_call>`` (the Hermes/Qwen convention), one per pair.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD = "<|endoftext|>"
UNK = "<unk>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE_START = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"
SPECIAL_TOKENS = (PAD, IM_START, IM_END, UNK)
"""Control tokens: never produced by ordinary text, skipped when decoding with skip_special_tokens."""
MARKUP_TOKENS = (TOOL_CALL_START, TOOL_CALL_END, TOOL_RESPONSE_START, TOOL_RESPONSE_END)
"""Single tokens for the tool-call markup; kept when decoding so tool calls can be parsed."""
CHARACTERS = "\n" + "".join(chr(c) for c in range(32, 127))
"""Every printable ASCII character and newline: each is one token; anything else is ``<unk>``."""

CHAT_TEMPLATE = (
    "{%- if messages and messages[0].role == 'system' %}"
    "{%- set system_text = messages[0].content if messages[0].content is string else '' %}"
    "{%- set rest = messages[1:] %}"
    "{%- else %}{%- set system_text = '' %}{%- set rest = messages %}{%- endif %}"
    "{%- if system_text or tools %}"
    "{{- '<|im_start|>system\\n' + system_text }}"
    "{%- if tools %}"
    "{{- '\\n# Tools\\n' }}"
    "{%- for tool in tools %}{{- (tool.function if tool.function is defined else tool) | tojson }}"
    "{{- '\\n' }}{%- endfor %}"
    '{{- \'Call a tool as <tool_call>{"name": NAME, "arguments": {...}}</tool_call>\' }}'
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in rest %}"
    "{%- set content = message.content if message.content is string else '' %}"
    "{%- if message.role == 'tool' %}"
    "{{- '<|im_start|>tool\\n<tool_response>' + content + '</tool_response><|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- for call in (message.tool_calls or []) %}"
    "{%- set fn = call.function if call.function is defined else call %}"
    "{{- '<tool_call>{\"name\": ' + (fn.name | tojson) + ', \"arguments\": ' }}"
    "{%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}"
    "{{- '}</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class TinyModelConfig:
    """Size of the tiny model (about 1M parameters with the defaults)."""

    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    vocab_size: int | None = None
    """None: the tokenizer's ~100 tokens. Larger: the vocabulary is padded with filler tokens (never
    produced by encoding text; decoded as ``<|filler_N|>``) so that embedding and output layers have the
    size of a real model's."""
    save_dtype: str = "float32"
    seed: int = 0


SHAPES: dict[str, TinyModelConfig] = {
    "tiny": TinyModelConfig(),
    # head_dim 64, which vLLM's attention kernels want; the GPU tests' and examples' model.
    "small": TinyModelConfig(hidden_size=256, intermediate_size=768, num_hidden_layers=4),
    # The dimensions of Qwen2.5-1.5B (28 layers, hidden 1536, MLP 8960, 12 query / 2 key-value heads,
    # 151936-entry tied vocabulary: 1.54B parameters) on the Llama architecture, random weights.
    "qwen2.5-1.5b": TinyModelConfig(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        vocab_size=151936,
        save_dtype="bfloat16",
    ),
}
"""Named model shapes for `grpojob tiny-model --shape`."""


def build_vocab(size: int | None = None) -> dict[str, int]:
    """Token → id: control tokens first, then tool markup, then one token per character, then fillers up
    to ``size`` entries."""
    tokens = [*SPECIAL_TOKENS, *MARKUP_TOKENS, *CHARACTERS]
    if size is not None:
        tokens += [f"<|filler_{index}|>" for index in range(size - len(tokens))]
    return {token: index for index, token in enumerate(tokens)}


def build_tokenizer(vocab_size: int | None = None):  # -> transformers.PreTrainedTokenizerFast
    """A character-level fast tokenizer with the chat template, built without any download."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = build_vocab(vocab_size)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=PAD,
        unk_token=UNK,
        chat_template=CHAT_TEMPLATE,
        model_max_length=TinyModelConfig.max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )


def write_tiny_model(out_dir: str | Path, config: TinyModelConfig | None = None) -> Path:
    """Write a randomly initialised Llama-architecture causal LM and its tokenizer to ``out_dir``.

    Deterministic: the same ``config`` (seed included) writes the same weights.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = config or TinyModelConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(config.vocab_size)
    vocab = build_vocab(config.vocab_size)
    model_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=vocab[IM_START],
        eos_token_id=vocab[IM_END],
        pad_token_id=vocab[PAD],
    )
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(config.seed)
        model = LlamaForCausalLM(model_config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config = GenerationConfig(
        eos_token_id=vocab[IM_END], pad_token_id=vocab[PAD], bos_token_id=vocab[IM_START]
    )
    model.to(getattr(torch, config.save_dtype)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    """Command line: write the tiny model to OUT_DIR."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="directory to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random initialisation")
    args = parser.parse_args(argv)
    out = write_tiny_model(args.out_dir, TinyModelConfig(seed=args.seed))
    print(f"wrote a tiny random model to {out}")


if __name__ == "__main__":
    main()
