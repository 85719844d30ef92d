"""Whether the policy's decoder layers go through ``torch.compile`` (`spec.training.torchCompile`), and where the
compiled kernels are kept so that a retry or a resumed job does not compile them again.

The one place the setting's default is resolved: unset compiles where the policy trains on CUDA, never on the
CPU; an explicit false never compiles, and an explicit true compiles on CUDA (it is ignored on the CPU).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

COMPILE_CACHE = "compile-cache"
"""The folder of the checkpoint directory that holds TorchInductor's cache (Triton's kernels inside it)."""
INDUCTOR_CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"


def compiles_layers(setting: bool | None, device: torch.device) -> bool:
    """Whether a policy training on ``device`` compiles its decoder layers, ``setting`` being
    `spec.training.torchCompile`."""
    return device.type == "cuda" and setting is not False


def compile_cache_dir(checkpoint_dir: str | Path) -> str:
    """Where the compiled kernels of a job whose checkpoints are in ``checkpoint_dir`` are kept (absolute)."""
    return str(Path(checkpoint_dir).resolve() / COMPILE_CACHE)


def use_compile_cache(directory: str, environ: MutableMapping[str, str] = os.environ) -> str:
    """Point TorchInductor's cache, and with it Triton's (``<cache>/triton`` unless ``TRITON_CACHE_DIR`` says
    otherwise), at ``directory``, unless ``TORCHINDUCTOR_CACHE_DIR`` is set already; the cache in use."""
    return environ.setdefault(INDUCTOR_CACHE_VARIABLE, directory)
