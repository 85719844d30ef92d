"""A local wheelhouse that the image builds install from, so a rebuild downloads nothing.

Every distribution the three images install (the project's pinned dependencies and extras, the
build backend, the Dockerfiles' own pins) is fetched once with ``pip download`` into
``~/.cache/grpojob/wheels/``. Builds bind-mount that folder at ``/wheels`` and a ``pip.conf`` at
``/etc/pip.conf`` that says ``no-index`` and ``find-links = /wheels``; the Dockerfiles are unchanged
and still install from PyPI wherever they are built without these mounts.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from grpojob_testing import build

REPO = build.TESTING_DIR.parent
EXTRAS = ("operator", "trainer")
PIP_CONF = "[global]\nno-index = true\nfind-links = /wheels\n"
PYTHON_VERSION = "3.11"
"""The Python of the base image (Debian bookworm's); wheels are chosen for it."""
PLATFORMS = ["manylinux2014_x86_64", *(f"manylinux_2_{minor}_x86_64" for minor in range(17, 37))]
"""Wheel platforms that run on the base image's glibc (bookworm: 2.36); pip does not expand them itself."""


def directory() -> Path:
    """The wheelhouse folder."""
    return build.cache_root() / "wheels"


def requirements() -> list[str]:
    """Every pinned requirement of the images: pyproject's, then those written in the Dockerfiles."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    found = list(pyproject["build-system"]["requires"]) + list(pyproject["project"]["dependencies"])
    for extra in EXTRAS:
        found += pyproject["project"]["optional-dependencies"][extra]
    for dockerfile in (REPO / "Dockerfile", REPO / "images" / "penguin-env" / "Dockerfile"):
        found += re.findall(r"\b([A-Za-z][\w.\-]*(?:\[[\w,]+\])?==[\w.]+)", dockerfile.read_text())
    return sorted(set(found))


def ensure() -> Path:
    """Download whatever the wheelhouse lacks (skipped when the requirements did not change)."""
    wanted = requirements()
    digest = hashlib.sha256("\n".join(wanted).encode()).hexdigest()[:16]
    folder = directory()
    stamp = folder / f".complete-{digest}"
    if not stamp.exists():
        folder.mkdir(parents=True, exist_ok=True)
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--dest", str(folder)]
        target = ["--only-binary=:all:", "--python-version", PYTHON_VERSION, *(f"--platform={p}" for p in PLATFORMS)]
        subprocess.run([*pip, *target, *wanted], check=True)
        stamp.touch()
    (folder / "pip.conf").write_text(PIP_CONF)
    return folder


def build_volumes() -> list[str]:
    """The ``--volume`` arguments that make a build install from the wheelhouse."""
    folder = ensure()
    return ["--volume", f"{folder}:/wheels:ro", "--volume", f"{folder / 'pip.conf'}:/etc/pip.conf:ro"]
