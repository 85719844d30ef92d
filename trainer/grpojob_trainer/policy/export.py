"""The trained policy as a Hugging Face model directory, which `vllm serve` and `transformers` load as they are.

An exported directory holds the weights as safetensors in the layout `transformers` writes (one
``model.safetensors``, or ``model-00001-of-0000N.safetensors`` shards with ``model.safetensors.index.json``
when larger than ``max_shard_size``; tied weights stored once), in the dtype asked for, beside the base
model's other files, copied unchanged: ``config.json`` (its dtype set to the weights'),
``generation_config.json``, the tokenizer files and the chat template. The base model is the model the
job started from: its directory, or a checkpoint, which carries those files too (`checkpoint.save_checkpoint`).

A LoRA policy exports either the merged model (its adapter merged into the base's weights,
`grpojob_trainer.policy.lora.merge_adapter`: a model directory like any other) or, as ``adapter``, a PEFT
adapter directory (``adapter_config.json`` naming its base model, ``adapter_model.safetensors``) beside
the tokenizer files, which ``vllm serve BASE --enable-lora --lora-modules NAME=DIR`` and `peft` load.

Like a checkpoint, a directory is written beside its final place and renamed into it when complete.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from grpojob_trainer.policy.checkpoint import (
    ADAPTER_WEIGHTS,
    META,
    latest_checkpoint,
    read_adapter,
    write_adapter_files,
)
from grpojob_trainer.policy.lora import merge_adapter
from grpojob_trainer.policy.model_files import copy_model_files, tokenizer_files

DTYPES = ("bfloat16", "float32")
DEFAULT_MAX_SHARD_SIZE = "5GB"
_STEP_EXPORT = re.compile(r"^step_(\d+)$")


@contextlib.contextmanager
def replaced_atomically(out: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary directory beside ``out`` to write into; renamed to ``out`` (replacing it) when the block
    completes, removed when it fails."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    try:
        yield temp
        if out.exists():
            shutil.rmtree(out)
        os.rename(temp, out)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise


def _torch_dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    return getattr(torch, dtype)


def write_model(
    state: dict[str, torch.Tensor],
    out: str | os.PathLike[str],
    *,
    base: str | os.PathLike[str],
    dtype: str = "bfloat16",
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Write ``state`` (a full model state dict, tied weights once) as a Hugging Face model directory at
    ``out``, with the other files of ``base``; an existing ``out`` is replaced. Returns ``out``."""
    from huggingface_hub import save_torch_state_dict

    torch_dtype = _torch_dtype(dtype)
    weights = {name: t.to(torch_dtype) if t.is_floating_point() else t for name, t in state.items()}
    with replaced_atomically(out) as temp:
        save_torch_state_dict(weights, temp, max_shard_size=max_shard_size, metadata={"format": "pt"})
        copy_model_files(base, temp, dtype)
    return Path(out)


def write_adapter(
    adapter: dict[str, torch.Tensor],
    config: dict[str, Any],
    out: str | os.PathLike[str],
    *,
    base: str | os.PathLike[str],
    dtype: str = "bfloat16",
) -> Path:
    """Write a LoRA adapter (tensors under PEFT's file names, its ``adapter_config.json``) as a PEFT adapter
    directory at ``out``, with the tokenizer files of ``base``; an existing ``out`` is replaced."""
    torch_dtype = _torch_dtype(dtype)
    with replaced_atomically(out) as temp:
        write_adapter_files(temp, {name: t.to(torch_dtype).contiguous() for name, t in adapter.items()}, config)
        for file in tokenizer_files(base):
            shutil.copyfile(file, temp / file.name)
    return Path(out)


def write_merged_model(
    adapter: dict[str, torch.Tensor],
    config: dict[str, Any],
    out: str | os.PathLike[str],
    *,
    base: str | os.PathLike[str],
    dtype: str = "bfloat16",
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Write the model directory of ``base`` (a model directory) with ``adapter`` merged into its weights."""
    merged = merge_adapter(read_weights(base), adapter, config)
    return write_model(merged, out, base=base, dtype=dtype, max_shard_size=max_shard_size)


def read_weights(directory: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors files of a model or checkpoint directory (one file or shards)."""
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory} holds no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state |= safetensors.torch.load_file(str(file))
    return state


def export_checkpoint(
    checkpoint: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    base: str | os.PathLike[str] | None = None,
    dtype: str = "bfloat16",
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    adapter: bool = False,
) -> Path:
    """`grpojob export`: the model of ``checkpoint`` (a `step_*` directory; a checkpoint directory, for its
    newest; or an exported model) as a Hugging Face model directory at ``out``. The config and tokenizer
    come from the checkpoint, or from ``base`` (the model the job started from) for a checkpoint that has
    none.

    A LoRA checkpoint's adapter is merged into its base model (``base``, else the one its
    ``adapter_config.json`` names), or with ``adapter`` written as a PEFT adapter directory."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise FileNotFoundError(f"{checkpoint} is not a directory")
    if not any((checkpoint / name).exists() for name in (META, "config.json", ADAPTER_WEIGHTS)):
        newest = latest_checkpoint(checkpoint)
        if newest is None:
            raise FileNotFoundError(f"{checkpoint} is neither a checkpoint, a directory of checkpoints nor a model")
        checkpoint = newest
    if (checkpoint / ADAPTER_WEIGHTS).is_file():
        return _export_adapter_checkpoint(checkpoint, out, base, dtype, max_shard_size, adapter)
    if adapter:
        raise ValueError(
            f"{checkpoint} holds a fully fine-tuned model, not a LoRA adapter: export it without --adapter"
        )
    files_from = Path(base) if base is not None else checkpoint
    if not (files_from / "config.json").is_file():
        raise FileNotFoundError(
            f"{files_from} has no config.json (a checkpoint written before checkpoints carried the model's "
            "files): name the model the job started from with --base"
        )
    return write_model(read_weights(checkpoint), out, base=files_from, dtype=dtype, max_shard_size=max_shard_size)


def _export_adapter_checkpoint(
    checkpoint: Path,
    out: str | os.PathLike[str],
    base: str | os.PathLike[str] | None,
    dtype: str,
    max_shard_size: int | str,
    as_adapter: bool,
) -> Path:
    weights, config = read_adapter(checkpoint)
    base_model = Path(base) if base is not None else Path(config.get("base_model_name_or_path") or "")
    if not (base_model / "config.json").is_file():
        raise FileNotFoundError(
            f"{checkpoint} is a LoRA adapter over {str(base_model) or 'an unnamed base'}, which is not a model "
            "directory here: name the model the job started from with --base"
        )
    if as_adapter:
        return write_adapter(
            weights, config | {"base_model_name_or_path": str(base_model)}, out, base=base_model, dtype=dtype
        )
    return write_merged_model(weights, config, out, base=base_model, dtype=dtype, max_shard_size=max_shard_size)


def prune_exports(output_dir: str | os.PathLike[str], keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` models exported with checkpoints (`step_*`) in ``output_dir``, and
    temporary directories of interrupted exports. Returns what was deleted."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    steps = sorted(
        (int(match.group(1)), entry)
        for entry in output_dir.iterdir()
        if (match := _STEP_EXPORT.match(entry.name)) and entry.is_dir()
    )
    doomed = [path for _, path in steps[:-keep]] + [e for e in output_dir.iterdir() if e.name.startswith(".tmp-")]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed
