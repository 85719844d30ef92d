"""What `grpojob_testing.images` builds and under which names, checked without a container engine."""

from __future__ import annotations

import re

import yaml

from grpojob_operator.settings import DEFAULT_ENVIRONMENT_IMAGE, DEFAULT_RAY_IMAGE, RAY_VERSION
from grpojob_testing import base_image, images, wheelhouse

REPO = images.REPO


def test_images_carry_the_names_the_chart_and_the_operator_default_to():
    chart = yaml.safe_load((REPO / "charts" / "grpojob" / "Chart.yaml").read_text())
    values = yaml.safe_load((REPO / "charts" / "grpojob" / "values.yaml").read_text())
    names = {image.key: image.name for image in images.images()}
    assert names["operator"] == f"{values['image']['repository']}:{chart['appVersion']}"
    assert names["penguin-env"] == DEFAULT_ENVIRONMENT_IMAGE == values["defaults"]["environmentImage"]
    assert names["trainer-cpu"] == f"{DEFAULT_RAY_IMAGE}-cpu"


def test_the_base_is_tagged_with_the_python_image_every_dockerfile_starts_from():
    for image in images.images():
        dockerfile = (REPO / image.dockerfile).read_text()
        python_image = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", dockerfile, re.MULTILINE).group(1)
        assert f"docker.io/library/{python_image}" == base_image.NAME
        if image.target:
            assert re.search(rf"^FROM \S+ AS {image.target}$", dockerfile, re.MULTILINE), image.target
    trainer = next(image for image in images.images() if image.key == "trainer-cpu")
    assert f"docker.io/library/{trainer.build_args['BASE_IMAGE']}" == base_image.NAME
    assert trainer.build_args["WITH_VLLM"] == "false"


def test_every_image_runs_the_python_that_nemo_gym_and_the_job_s_ray_cluster_share():
    assert base_image.PYTHON == "3.13" and base_image.SUITE == "trixie"
    gpu_base = re.search(r"^ARG BASE_IMAGE=(\S+)$", (REPO / "Dockerfile").read_text(), re.MULTILINE).group(1)
    assert gpu_base == f"rayproject/ray:{RAY_VERSION}-py313-cu128"


def test_the_wheelhouse_holds_every_pin_of_pyproject_and_the_dockerfiles():
    wanted = wheelhouse.requirements()
    for pin in ("setuptools==80.9.0", "pydantic==2.14.3", "kopf==1.45.2", "torch==2.15.0", "build==1.6.1"):
        assert pin in wanted
    assert "ray[default]==2.60.0" in wanted and "fastapi==0.163.2" in wanted
    assert all("==" in requirement for requirement in wanted)


def test_the_nemo_gym_image_locks_nemo_gym_and_the_cluster_s_ray():
    locked = wheelhouse.nemo_gym_requirements()
    assert "nemo-gym==0.4.0" in locked and f"ray=={RAY_VERSION}" in locked
    assert all(re.fullmatch(r"[\w.\-]+(\[[\w,]+\])?==[\w.]+", requirement) for requirement in locked)


def test_no_image_is_made_of_the_test_tooling():
    for image in images.images():
        assert not [path for path in images.context_files(image.files) if path.startswith("testing/")]
    assert "COPY testing" not in (REPO / "Dockerfile").read_text()


def test_an_image_is_rebuilt_when_a_source_file_changes(monkeypatch):
    operator = images.images()[0]
    before = images.inputs_hash(operator, "base")
    assert images.inputs_hash(operator, "other-base") != before
    assert "operator/grpojob_operator/manifests.py" in images.context_files(operator.files)
    real_read_bytes = type(REPO).read_bytes

    def edited(path, *args):
        data = real_read_bytes(path, *args)
        return data + b"# edited" if path.name == "manifests.py" else data

    monkeypatch.setattr(type(REPO), "read_bytes", edited)
    assert images.inputs_hash(operator, "base") != before


def test_containers_get_ulimits_this_machine_lets_runc_set():
    flags = images.ulimits()
    assert [flag.split("=")[1] for flag in flags] == ["nofile", "nproc"]
    for flag in flags:
        soft, hard = flag.rsplit("=", 1)[1].split(":")
        assert soft == hard and int(hard) > 0
