"""The grpojob wheel ships the product packages and not the test tooling."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_has_the_product_packages_and_no_test_tooling(tmp_path: Path):
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source)
    for folder in ("api", "operator", "trainer", "testing"):
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    build = "from setuptools import build_meta; import sys; print(build_meta.build_wheel(sys.argv[1]))"
    result = subprocess.run(
        [sys.executable, "-c", build, str(tmp_path / "dist")],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    wheel = tmp_path / "dist" / result.stdout.strip().splitlines()[-1]

    packages = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".py")}

    assert packages == {"grpojob_api", "grpojob_operator", "grpojob_trainer"}
