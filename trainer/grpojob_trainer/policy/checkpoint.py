"""Self-describing training checkpoints, written atomically, the newest ``keep`` of them kept.

Layout of ``<directory>/step_<step:08d>/``:

- ``meta.json``: format version, step, the data loader's position (an opaque JSON dict), the config
  that produced the run (an opaque JSON dict: the GRPOJob spec) and the model's architecture config;
- ``model.safetensors``: the model's parameters and buffers (tied weights stored once);
- ``optimizer.pt``: the optimizer's state dict, as ``torch.optim.Optimizer.state_dict`` writes it
  (parameters numbered in the order of the optimizer's parameter groups);
- ``rng.pt``: Python, NumPy and torch (CPU, and CUDA when present) random-number-generator states;
- the base model's other files (``config.json``, its dtype float32, ``generation_config.json``, the
  tokenizer files and chat template; `grpojob_trainer.policy.model_files.model_files`), when the saver names
  the model the run started from: then a checkpoint is also a Hugging Face model directory (float32),
  which `grpojob export` converts and which a new job's ``spec.model.path`` can start from.

A checkpoint is written to a hidden temporary directory beside its final place and renamed into place
only when every file is complete, so a crash mid-write leaves no ``step_*`` directory: a half-written
checkpoint is never loaded. `latest_checkpoint` also ignores a ``step_*`` directory without ``meta.json``.

A LoRA policy's checkpoint (`grpojob_trainer.policy.lora`) holds the adapter instead of the model:
``adapter_model.safetensors`` and ``adapter_config.json`` as PEFT writes them (so the checkpoint is also
an adapter directory), beside ``meta.json``, ``optimizer.pt`` (the adapter's optimizer state) and
``rng.pt``; the frozen base stays where the run loaded it from.

A policy sharded over several ranks (FSDP2) writes the same files: every rank takes part in gathering
the full model and optimizer state (``torch.distributed.checkpoint.state_dict``), rank 0 writes them;
every rank loads the full state and keeps its shard. So a checkpoint of N ranks resumes on M.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch

from grpojob_trainer.policy.lora import adapter_config, adapter_parameter_name, adapter_weights, is_lora
from grpojob_trainer.policy.model_files import copy_model_files

FORMAT_VERSION = 1
META = "meta.json"
MODEL = "model.safetensors"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
OPTIMIZER = "optimizer.pt"
RNG = "rng.pt"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_TEMP_PREFIX = ".tmp-step_"


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint says about the run it came from."""

    path: Path
    step: int
    data_position: dict[str, Any]
    config: dict[str, Any]


def checkpoint_path(directory: str | os.PathLike[str], step: int) -> Path:
    return Path(directory) / f"step_{step:08d}"


def rng_state() -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's global random-number generators."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    random.setstate(state["python"])
    saved = state["numpy"]
    np.random.set_state(
        (
            saved["kind"],
            saved["keys"].numpy().astype(np.uint32),
            saved["pos"],
            saved["has_gauss"],
            saved["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def tied_names(model: torch.nn.Module) -> list[list[str]]:
    """Names of parameters that are one tensor (tied weights), in groups of two or more, first name first."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def optimizer_param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of ``optimizer``'s parameters in the order its state dict numbers them."""
    names = {id(param): name for name, param in model.named_parameters()}
    return [names[id(param)] for group in optimizer.param_groups for param in group["params"]]


def optimizer_state_by_index(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter names (``get_optimizer_state_dict``'s) keyed by number
    instead, as ``Optimizer.state_dict`` numbers them: in the order of the parameter groups."""
    index: dict[str, int] = {}
    groups = []
    for group in state["param_groups"]:
        groups.append({**group, "params": [index.setdefault(name, len(index)) for name in group["params"]]})
    return {"state": {index[name]: value for name, value in state["state"].items()}, "param_groups": groups}


def optimizer_state_by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The inverse of `optimizer_state_by_index`, for parameters numbered as ``names`` lists them."""
    return {
        "state": {names[index]: value for index, value in state["state"].items()},
        "param_groups": [{**group, "params": [names[i] for i in group["params"]]} for group in state["param_groups"]],
    }


def gather_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full (unsharded, on the CPU) model state, tied weights once. A collective on a sharded model:
    every rank calls it, rank 0 gets the state and the others an empty dict."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    model_state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not model_state:
        return {}
    for names in tied_names(model):
        for alias in names[1:]:
            model_state.pop(alias, None)
    return {k: v.contiguous() for k, v in model_state.items()}


def gather_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """`gather_model_state`, and the optimizer state, numbered as ``Optimizer.state_dict`` numbers it.
    A collective on a sharded model: rank 0 gets the states and the others empty dicts."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    model_state = gather_model_state(model)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    optimizer_state = get_optimizer_state_dict(model, optimizer, options=options)
    if not model_state:
        return {}, {}
    return model_state, optimizer_state_by_index(optimizer_state)


def gather_adapter_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A LoRA policy's `gather_state`: the adapter's tensors under their file names and the optimizer's
    state. A collective on a sharded model: rank 0 gets the states and the others empty dicts."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from grpojob_trainer.policy.ranks import rank

    adapter = {name: tensor.cpu().contiguous() for name, tensor in adapter_weights(model)}
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    optimizer_state = get_optimizer_state_dict(model, optimizer, options=options)
    if rank() != 0:
        return {}, {}
    return adapter, optimizer_state_by_index(optimizer_state)


def restore_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any] | None,
    *,
    strict: bool = True,
) -> None:
    """Load full states (as `gather_state` returns them, or as read from a checkpoint) into a model and
    optimizer, sharded or not (every rank of a sharded model calls it with the full states). Not
    ``strict``: ``model_state`` may hold only some of the model's tensors (a LoRA policy's adapter)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    model_state = dict(model_state)
    for names in tied_names(model):
        present = next((name for name in names if name in model_state), None)
        if present is not None:
            model_state |= {name: model_state[present] for name in names}
    options = StateDictOptions(full_state_dict=True, strict=strict)
    set_model_state_dict(model, model_state, options=options)
    if optimizer is not None and optimizer_state is not None:
        named = optimizer_state_by_name(optimizer_state, optimizer_param_names(model, optimizer))
        set_optimizer_state_dict(model, optimizer, named, options=options)


@dataclass(frozen=True)
class CheckpointRequest:
    """A checkpoint to write, as the driver asks every rank for it (`PolicyGroup.save`): where, of which step,
    what it records beside the model, and which checkpoints are kept."""

    directory: str
    step: int
    data_position: dict[str, Any]
    """Where the run is in its data (and its evaluation history): what a resumed run restores."""
    config: dict[str, Any]
    """The job, as JSON: the checkpoint describes the run that wrote it."""
    keep: int | None = None
    """Keep the newest this many checkpoints (None: delete none)."""
    kept_step: int | None = None
    """Keep the checkpoint of this step too (the best evaluation's)."""


def save_checkpoint(
    directory: str | os.PathLike[str],
    *,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    data_position: dict[str, Any],
    config: dict[str, Any],
    keep: int | None = None,
    kept_step: int | None = None,
    base_model: str | os.PathLike[str] | None = None,
) -> Path:
    """Write the checkpoint of ``step`` atomically; with ``keep``, then delete all but the newest ``keep``
    and that of ``kept_step``.
    With ``base_model`` (the model directory the run started from) the checkpoint carries its config,
    generation config and tokenizer files, so it is a model directory too; a LoRA policy's checkpoint
    holds its adapter (naming ``base_model`` as its base) and no model files.

    ``data_position`` and ``config`` must be JSON-serialisable. An existing checkpoint of the same step
    is replaced. Returns the checkpoint's directory. With a sharded model every rank calls this (the
    state is gathered from all of them) and rank 0 writes.
    """
    directory = Path(directory)
    final = checkpoint_path(directory, step)
    lora = is_lora(model)
    model_state, optimizer_state = gather_adapter_state(model, optimizer) if lora else gather_state(model, optimizer)
    if not model_state:  # not rank 0
        return final
    directory.mkdir(parents=True, exist_ok=True)
    model_config = model.config.to_dict() if hasattr(model, "config") and hasattr(model.config, "to_dict") else None
    meta = {
        "format": FORMAT_VERSION,
        "step": step,
        "data_position": data_position,
        "config": config,
        "model_config": model_config,
    }
    meta_text = json.dumps(meta, indent=2, sort_keys=True)  # fails before anything is written
    temp = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{step:08d}-", dir=directory))
    try:
        if lora:
            write_adapter_files(temp, model_state, adapter_config(model, str(base_model or "")))
        else:
            safetensors.torch.save_file(model_state, str(temp / MODEL), metadata={"format": "pt"})
        torch.save(optimizer_state, temp / OPTIMIZER)
        torch.save(rng_state(), temp / RNG)
        if base_model is not None and not lora:
            copy_model_files(base_model, temp, "float32")
        (temp / META).write_text(meta_text, encoding="utf-8")
        for file in temp.iterdir():
            _fsync(file)
        if final.exists():
            shutil.rmtree(final)
        os.rename(temp, final)
        _fsync(directory)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    if keep is not None:
        prune_checkpoints(directory, keep, kept_step)
    return final


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    restore_rng: bool = True,
) -> CheckpointInfo:
    """Load a checkpoint into ``model`` (in place: existing parameter objects, so an optimizer built
    over them stays valid), ``optimizer`` when given, and the global RNGs when ``restore_rng``. Every
    rank of a sharded model calls it and keeps its shards."""
    path = Path(path)
    meta = json.loads((path / META).read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path}: checkpoint format {meta.get('format')!r}, this trainer reads {FORMAT_VERSION}")
    lora = is_lora(model)
    if lora != (path / ADAPTER_WEIGHTS).is_file():
        raise ValueError(
            f"{path}: a checkpoint of a {'LoRA' if not lora else 'fully fine-tuned'} policy cannot resume a "
            f"{'LoRA' if lora else 'fully fine-tuned'} one (spec.training.lora changed)"
        )
    model_state = read_adapter_state(path, model) if lora else safetensors.torch.load_file(str(path / MODEL))
    optimizer_state = None
    if optimizer is not None:
        optimizer_state = torch.load(path / OPTIMIZER, map_location="cpu", weights_only=True)
    restore_state(model, optimizer, model_state, optimizer_state, strict=not lora)
    if restore_rng:
        set_rng_state(torch.load(path / RNG, weights_only=True))
    return CheckpointInfo(path=path, step=meta["step"], data_position=meta["data_position"], config=meta["config"])


def write_adapter_files(directory: Path, adapter: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
    """Write an adapter as PEFT does: ``adapter_model.safetensors`` (tensors under their file names) and
    ``adapter_config.json``."""
    safetensors.torch.save_file(adapter, str(directory / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (directory / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_adapter(directory: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """An adapter directory's (or a LoRA checkpoint's) tensors, under their file names, and its config."""
    directory = Path(directory)
    config = json.loads((directory / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    return safetensors.torch.load_file(str(directory / ADAPTER_WEIGHTS)), config


def read_adapter_state(path: Path, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A LoRA checkpoint's adapter under the policy's parameter names; raises unless it holds exactly the
    policy's trainable parameters with their shapes (a different rank or targetModules cannot resume)."""
    adapter, _ = read_adapter(path)
    state = {adapter_parameter_name(name): tensor for name, tensor in adapter.items()}
    trainable = {name: tuple(p.shape) for name, p in model.named_parameters() if p.requires_grad}
    saved = {name: tuple(t.shape) for name, t in state.items()}
    if saved != trainable:
        differ = sorted(set(saved) ^ set(trainable)) or sorted(n for n in saved if saved[n] != trainable[n])
        raise ValueError(
            f"{path}: the checkpoint's adapter does not fit the policy's (spec.training.lora rank or "
            f"targetModules changed?): {len(differ)} tensors differ, e.g. {differ[0]}"
        )
    return state


def list_checkpoints(directory: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``directory`` as ``(step, path)``, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        match = _STEP_DIR.match(entry.name)
        if match and entry.is_dir() and (entry / META).is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def latest_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    """The complete checkpoint with the highest step, or None."""
    checkpoints = list_checkpoints(directory)
    return checkpoints[-1][1] if checkpoints else None


def prune_checkpoints(directory: str | os.PathLike[str], keep: int, kept_step: int | None = None) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints and that of ``kept_step`` (the best
    evaluation's), and leftover temporary directories of interrupted saves (one trainer writes a directory
    at a time). Returns what was deleted."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    directory = Path(directory)
    doomed = [path for step, path in list_checkpoints(directory)[:-keep] if step != kept_step]
    doomed += [entry for entry in directory.iterdir() if entry.name.startswith(_TEMP_PREFIX)]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
