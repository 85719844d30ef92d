"""A tiny, randomly initialised causal LM written as a standard Hugging Face model directory.

`python -m grpojob_trainer.models.tiny OUT_DIR [--seed S]` writes weights (safetensors), config,
generation config and a character-level tokenizer with a ChatML-style chat template, all built
offline. The directory loads with ``AutoModelForCausalLM.from_pretrained(OUT_DIR)`` and
``AutoTokenizer.from_pretrained(OUT_DIR)``. The same seed writes the same weights (on the same device).

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
    rope_theta: float = 10000.0
    """Base wavelength of the rotary position embeddings (Llama's default; Qwen2.5's is 1e6)."""
    tie_word_embeddings: bool = True
    """The output layer shares the embedding matrix (Qwen2.5 up to 3B); False gives it its own (7B and up)."""
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
    # The dimensions of Qwen2.5-7B (28 layers, hidden 3584, MLP 18944, 28 query / 4 key-value heads,
    # 152064-entry untied vocabulary, RoPE base 1e6: 7.62B parameters) on the Llama architecture (without
    # Qwen2's q/k/v biases), random weights. Written in bf16 (15 GB), initialised on a GPU when there is one.
    "qwen2.5-7b": TinyModelConfig(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        tie_word_embeddings=False,
        vocab_size=152064,
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


def llama_config(config: TinyModelConfig):  # -> transformers.LlamaConfig
    """The Hugging Face configuration of ``config``'s model: its shape on the Llama architecture, with the
    vocabulary size and special-token ids of `build_vocab`."""
    from transformers import LlamaConfig

    vocab = build_vocab(config.vocab_size)
    return LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        tie_word_embeddings=config.tie_word_embeddings,
        bos_token_id=vocab[IM_START],
        eos_token_id=vocab[IM_END],
        pad_token_id=vocab[PAD],
    )


def parameter_count(config: TinyModelConfig) -> int:
    """Parameters of ``config``'s model (a tied output layer counted once), counted on the meta device:
    nothing is allocated."""
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(llama_config(config))
    return sum(parameter.numel() for parameter in model.parameters())


GPU_INIT_PARAMETERS = 1_000_000_000
"""Models above this many parameters are initialised on a CUDA GPU when there is one (a 7B model takes
minutes of random-number generation on a few CPU cores)."""


def default_device(config: TinyModelConfig) -> str:
    """Where `write_tiny_model` initialises the weights unless told: ``"cuda"`` for a model above
    `GPU_INIT_PARAMETERS` when CUDA is available, else ``"cpu"``."""
    import torch

    if torch.cuda.is_available() and parameter_count(config) > GPU_INIT_PARAMETERS:
        return "cuda"
    return "cpu"


def write_tiny_model(out_dir: str | Path, config: TinyModelConfig | None = None, device: str | None = None) -> Path:
    """Write a randomly initialised Llama-architecture causal LM and its tokenizer to ``out_dir``.

    The weights are created directly in ``config.save_dtype`` on ``device`` (default: `default_device`), so
    the peak memory is one copy of the model in that dtype (15 GB for the bf16 7B shape), and written from
    there in safetensors shards of at most 5 GB. Deterministic: the same ``config`` (seed included) on the
    same device writes the same weights. The caller's random-number generators are left as they were.
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    config = config or TinyModelConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(config.vocab_size)
    vocab = build_vocab(config.vocab_size)
    model_config = llama_config(config)
    target = torch.device(device or default_device(config))
    with torch.random.fork_rng(devices=[target] if target.type == "cuda" else []):
        torch.manual_seed(config.seed)
        with target:
            model = AutoModelForCausalLM.from_config(model_config, dtype=getattr(torch, config.save_dtype))
    model.generation_config = GenerationConfig(
        eos_token_id=vocab[IM_END], pad_token_id=vocab[PAD], bos_token_id=vocab[IM_START]
    )
    model.save_pretrained(out, max_shard_size="5GB")
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
