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

Saving takes two parts: `snapshot_checkpoint` copies the state out of the policy into host memory of its own
(the only part the training waits for), and `write_checkpoint` writes that snapshot, which may run on a thread
of its own while the policy trains on (`grpojob_trainer.policy.checkpoint_writer`). The write goes to a hidden
temporary directory beside the final place, every file fsynced, and the directory is renamed into place only then,
so a crash or a kill mid-write leaves no ``step_*`` directory: a half-written checkpoint is never loaded.
`latest_checkpoint` also ignores a ``step_*`` directory without ``meta.json``, and `remove_unfinished` (run
when a run resumes) deletes what interrupted writes left.

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
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from grpojob_trainer.policy.lora import adapter_config, adapter_parameter_name, is_lora
from grpojob_trainer.policy.model_files import copy_model_files
from grpojob_trainer.policy.state import (
    HostCopies,
    gather_adapter_state,
    gather_state,
    restore_state,
    rng_state,
    set_rng_state,
    sharded,
    storages,
)
from grpojob_trainer.policy.tensor_file import write_safetensors

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


@dataclass
class CheckpointSnapshot:
    """Everything a checkpoint of one step holds, in host memory of its own (no tensor shares memory with the
    policy, which trains on meanwhile), or with ``live`` the policy's own tensors: what `write_checkpoint`
    writes."""

    directory: Path
    step: int
    meta_text: str
    """``meta.json``, already serialised (a position or config that is not JSON fails before any copy)."""
    model_state: dict[str, torch.Tensor]
    """The model's tensors, or a LoRA policy's adapter under its file names."""
    optimizer_state: dict[str, Any]
    rng: dict[str, Any]
    adapter_config: dict[str, Any] | None
    """A LoRA policy's ``adapter_config.json``; None for a full fine-tune."""
    base_model: str | None
    keep: int | None = None
    kept_step: int | None = None
    live: bool = False
    """The tensors are the policy's own, not copies (a copy would not fit the host memory left): the checkpoint
    must be written before the policy trains on."""

    @property
    def path(self) -> Path:
        return checkpoint_path(self.directory, self.step)


def snapshot_checkpoint(
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
    host: HostCopies | None = None,
) -> CheckpointSnapshot | None:
    """Copy what the checkpoint of ``step`` holds out of the policy (off its GPU, out of its shards) into host
    memory of its own, with the random-number generators' states as they are now; the training may go on once it
    returns. A collective on a sharded model: every rank calls it, rank 0 gets the snapshot and the others None.
    ``data_position`` and ``config`` must be JSON-serialisable. ``host``: the host memory to copy into, kept from
    one checkpoint to the next (the snapshot's tensors are valid until its next copy). Where a copy would not fit
    the host memory left (`HostCopies.fits`), the snapshot holds the policy's own tensors (``live``) and its
    write copies them one at a time."""
    lora = is_lora(model)
    model_config = model.config.to_dict() if hasattr(model, "config") and hasattr(model.config, "to_dict") else None
    meta = {
        "format": FORMAT_VERSION,
        "step": step,
        "data_position": data_position,
        "config": config,
        "model_config": model_config,
    }
    meta_text = json.dumps(meta, indent=2, sort_keys=True)  # fails before anything is gathered or written
    gather = gather_adapter_state if lora else gather_state
    # One rank: the policy's own tensors, copied below all at once. Several: gathered into rank 0's host memory.
    model_state, optimizer_state = gather(model, optimizer, offload=sharded())
    if not model_state:  # not rank 0
        return None
    live = storages([*model.state_dict().values(), *(t for s in optimizer.state.values() for t in s.values())])
    host = host or HostCopies()
    states = {"model": model_state, "optimizer": optimizer_state}
    streamed = not host.fits(states, live)
    if streamed:
        host.release()
    copied = states if streamed else host.copy(states, live)
    return CheckpointSnapshot(
        directory=Path(directory),
        step=step,
        meta_text=meta_text,
        model_state=copied["model"],
        optimizer_state=copied["optimizer"],
        rng=rng_state(),
        adapter_config=adapter_config(model, str(base_model or "")) if lora else None,
        base_model=None if base_model is None else str(base_model),
        keep=keep,
        kept_step=kept_step,
        live=streamed,
    )


def write_checkpoint(snapshot: CheckpointSnapshot) -> Path:
    """Write ``snapshot`` into a hidden temporary directory beside its place, fsync every file, then rename the
    directory into place (an existing checkpoint of the same step is replaced); with ``keep``, then delete all but
    the newest ``keep`` and that of ``kept_step``. A write that fails or is killed midway publishes nothing: the
    newest complete checkpoint stays the latest. Returns the checkpoint's directory."""
    directory, final = snapshot.directory, snapshot.path
    directory.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{snapshot.step:08d}-", dir=directory))
    try:
        if snapshot.adapter_config is not None:
            write_adapter_files(temp, snapshot.model_state, snapshot.adapter_config)
        else:
            write_safetensors(temp / MODEL, snapshot.model_state, metadata={"format": "pt"})
        torch.save(snapshot.optimizer_state, temp / OPTIMIZER)  # one storage at a time, off any device
        torch.save(snapshot.rng, temp / RNG)
        if snapshot.base_model is not None and snapshot.adapter_config is None:
            copy_model_files(snapshot.base_model, temp, "float32")
        (temp / META).write_text(snapshot.meta_text, encoding="utf-8")  # last: a directory without it is not one
        for file in temp.iterdir():
            _fsync(file)
        _fsync(temp)
        replaced = None
        if final.exists():  # moved aside whole first: a crash between the renames leaves no half checkpoint
            replaced = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{snapshot.step:08d}-old-", dir=directory))
            os.rename(final, replaced / final.name)
        os.rename(temp, final)
        _fsync(directory)
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    if snapshot.keep is not None:
        prune_checkpoints(directory, snapshot.keep, snapshot.kept_step)
    return final


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
    """`snapshot_checkpoint`, then `write_checkpoint`, in the caller's thread; the checkpoint's directory.

    With ``base_model`` (the model directory the run started from) the checkpoint carries its config,
    generation config and tokenizer files, so it is a model directory too; a LoRA policy's checkpoint
    holds its adapter (naming ``base_model`` as its base) and no model files. With a sharded model every rank
    calls this (the state is gathered from all of them) and rank 0 writes.
    """
    snapshot = snapshot_checkpoint(
        directory,
        step=step,
        model=model,
        optimizer=optimizer,
        data_position=data_position,
        config=config,
        keep=keep,
        kept_step=kept_step,
        base_model=base_model,
        host=HostCopies(keep_bytes=0),  # once: no pinned buffers to keep
    )
    return checkpoint_path(directory, step) if snapshot is None else write_checkpoint(snapshot)


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


def checkpoint_bytes(path: str | os.PathLike[str]) -> int | None:
    """The size of the checkpoint at ``path``: its files' bytes, in all (None: it could not be read)."""
    try:
        return sum(file.stat().st_size for file in Path(path).rglob("*") if file.is_file())
    except OSError:
        return None


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
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed + remove_unfinished(directory)


def remove_unfinished(directory: str | os.PathLike[str]) -> list[Path]:
    """Delete what interrupted writes left under ``directory`` (their temporary directories), while no write is in
    flight (as a run resumes). Returns what was deleted."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    doomed = [entry for entry in directory.iterdir() if entry.name.startswith(_TEMP_PREFIX)]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
