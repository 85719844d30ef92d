"""What the README's commands write into the checkout stays out of `git status`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "path",
    [
        "runs/tiny-model/config.json",  # make demo: the tiny model, its rows, its checkpoints
        "models/tiny/final/model.safetensors",  # a job's exported model (spec.output.path's default)
        ".gpuparts/p0/part_00",  # the GPU machine's wheel parts
        "build/site/index.html",  # make docs: the documentation site
    ],
)
def test_what_the_readme_commands_write_is_ignored_by_git(path: str):
    ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, check=False)
    assert ignored.returncode == 0, f"{path} would show up in git status"


def test_the_sources_are_not_ignored():
    ignored = subprocess.run(["git", "check-ignore", "-q", "trainer/grpojob_trainer/models/tiny.py"], cwd=ROOT)
    assert ignored.returncode == 1
