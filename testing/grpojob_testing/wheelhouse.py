"""A local wheelhouse that the image builds install from, so a rebuild downloads nothing.

Every distribution the images install is fetched once with ``pip download`` into
``~/.cache/grpojob/wheels/``, for the base image's Python (`base_image.PYTHON`), in two sets that
are resolved apart because they pin different versions of the same packages (our ``openai`` and
NeMo Gym's ``openai<=2.7.2``):

- ours: pyproject's build backend, dependencies and the extras the images install, plus the pins
  written in the Dockerfiles (the ``build`` frontend);
- NeMo Gym's: ``images/nemo-gym/requirements.txt``, a complete lock, taken as it is (``--no-deps``;
  one of its packages, ``antlr4-python3-runtime``, exists only as a source archive).

The GPU trainer image's lock, ``images/vllm-requirements.txt`` (vLLM and its torch, with the rest of
the trainer), is a third set in ``wheels/gpu/``, fetched only when that image is built (`ensure_gpu`;
about 3.7 GB).

Builds bind-mount that folder at ``/wheels`` and a ``pip.conf`` at ``/etc/pip.conf`` that says
``no-index`` and ``find-links = /wheels`` (and ``/wheels/gpu`` for the GPU image); the Dockerfiles
are unchanged and still install from PyPI wherever they are built without these mounts.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from grpojob_testing import base_image, build

REPO = build.TESTING_DIR.parent
EXTRAS = ("operator", "environment", "trainer")
"""The extras of pyproject that the images install."""
DOCKERFILES = ("Dockerfile",)
NEMO_GYM_LOCK = "images/nemo-gym/requirements.txt"
GPU_LOCK = "images/vllm-requirements.txt"
PIP_CONF = "[global]\nno-index = true\nfind-links = /wheels\n"
GPU_PIP_CONF = "[global]\nno-index = true\nfind-links =\n    /wheels\n    /wheels/gpu\n"
GLIBC_MINOR = 41
"""The base image's glibc is 2.41 (trixie): wheels of any manylinux_2_N with N up to this run there."""
PLATFORMS = ["manylinux2014_x86_64", *(f"manylinux_2_{minor}_x86_64" for minor in range(17, GLIBC_MINOR + 1))]
"""Wheel platforms that run on the base image's glibc; pip does not expand them itself."""


def directory() -> Path:
    """The wheelhouse folder."""
    return build.cache_root() / "wheels"


def pinned(line: str) -> str | None:
    """The requirement of one requirements-file line, or None for comments and blank lines."""
    requirement = line.split("#", 1)[0].strip()
    return requirement or None


def requirements() -> list[str]:
    """Our pinned requirements: pyproject's (its own ``grpojob[...]`` references left out), then the
    Dockerfiles'."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    found = list(pyproject["build-system"]["requires"]) + list(pyproject["project"]["dependencies"])
    for extra in EXTRAS:
        found += [r for r in pyproject["project"]["optional-dependencies"][extra] if not r.startswith("grpojob[")]
    for dockerfile in DOCKERFILES:
        found += re.findall(r"\b([A-Za-z][\w.\-]*(?:\[[\w,]+\])?==[\w.]+)", (REPO / dockerfile).read_text())
    return sorted(set(found))


def nemo_gym_requirements() -> list[str]:
    """The NeMo Gym image's lock: every package of its environment, pinned."""
    lines = (REPO / NEMO_GYM_LOCK).read_text().splitlines()
    return [requirement for requirement in map(pinned, lines) if requirement]


def gpu_requirements() -> list[str]:
    """The GPU trainer image's lock: every package of its environment, pinned."""
    lines = (REPO / GPU_LOCK).read_text().splitlines()
    return [requirement for requirement in map(pinned, lines) if requirement]


def _download(folder: Path, sets: list[tuple[list[str], list[str]]]) -> None:
    """``pip download`` each (flags, requirements) set into ``folder`` for the base image's Python,
    unless a stamp says these very sets are there already."""
    inputs = "\n".join(
        [base_image.PYTHON, *PLATFORMS, *(line for flags, reqs in sets for line in [*flags, *reqs, "--"])]
    )
    stamp = folder / f".complete-{hashlib.sha256(inputs.encode()).hexdigest()[:16]}"
    if stamp.exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--dest", str(folder)]
    target = ["--python-version", base_image.PYTHON, *(f"--platform={p}" for p in PLATFORMS)]
    for flags, requirements_set in sets:
        subprocess.run([*pip, *target, *flags, *requirements_set], check=True)
    stamp.touch()


def ensure() -> Path:
    """Download whatever the wheelhouse lacks (skipped when the requirements did not change)."""
    folder = directory()
    _download(folder, [(["--only-binary=:all:"], requirements()), (["--no-deps"], nemo_gym_requirements())])
    (folder / "pip.conf").write_text(PIP_CONF)
    return folder


def ensure_gpu() -> Path:
    """`ensure`, and the GPU image's set in ``wheels/gpu`` (skipped when its lock did not change)."""
    folder = ensure()
    _download(folder / "gpu", [(["--only-binary=:all:", "--no-deps"], gpu_requirements())])
    (folder / "pip-gpu.conf").write_text(GPU_PIP_CONF)
    return folder


def build_volumes(*, gpu: bool = False) -> list[str]:
    """The ``--volume`` arguments that make a build install from the wheelhouse (with the GPU image's
    set when ``gpu``)."""
    folder = ensure_gpu() if gpu else ensure()
    conf = folder / ("pip-gpu.conf" if gpu else "pip.conf")
    return ["--volume", f"{folder}:/wheels:ro", "--volume", f"{conf}:/etc/pip.conf:ro"]
