"""The files of a Hugging Face model directory besides its weights, and copying them into a new directory.

A leaf: both a checkpoint (`grpojob_trainer.policy.checkpoint`, which carries the base model's files) and an
exported model (`grpojob_trainer.policy.export`) need these, and neither imports the other for them.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".index.json")
"""Files of a model or checkpoint directory that hold (or index) weights or training state, never copied."""
CHECKPOINT_ONLY_FILES = frozenset({"meta.json"})


def model_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The files of a model directory besides its weights: config, generation config, tokenizer files,
    chat template, README (not a checkpoint's own files, not hidden files, not subdirectories)."""
    found = []
    for entry in sorted(Path(directory).iterdir()):
        if entry.name.startswith(".") or entry.is_dir() or entry.name in CHECKPOINT_ONLY_FILES:
            continue
        if not entry.name.endswith(WEIGHT_SUFFIXES):
            found.append(entry)
    return found


TOKENIZER_FILES = frozenset(
    {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "chat_template.json"}
)
"""What an adapter directory carries of its base model: the tokenizer and the chat template (vLLM and
`peft` read an adapter's own tokenizer when it has one)."""


def tokenizer_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The tokenizer files among `model_files` of ``directory`` (including vocabulary files such as
    ``vocab.json``, ``merges.txt`` and ``tokenizer.model``)."""
    vocabulary = ("vocab.json", "vocab.txt", "merges.txt", "tokenizer.model")
    return [f for f in model_files(directory) if f.name in TOKENIZER_FILES or f.name in vocabulary]


def copy_model_files(base: str | os.PathLike[str], out: str | os.PathLike[str], dtype: str) -> None:
    """Copy `model_files` of ``base`` into ``out`` (following the hub cache's symlinks), with the dtype in
    ``config.json`` set to ``dtype``; write a ``generation_config.json`` from the config if ``base`` has none."""
    if not (Path(base) / "config.json").is_file():
        raise FileNotFoundError(f"{base} has no config.json: not a Hugging Face model directory")
    for file in model_files(base):
        shutil.copyfile(file, Path(out) / file.name)
    config_path = Path(out) / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    for key in ("dtype", "torch_dtype"):
        if key in config:
            config[key] = dtype
    config.setdefault("dtype", dtype)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if not (Path(out) / "generation_config.json").exists():
        from transformers import AutoConfig, GenerationConfig

        GenerationConfig.from_model_config(AutoConfig.from_pretrained(out, local_files_only=True)).save_pretrained(out)
