"""What `grpojob_testing.images` builds and under which names, checked without a container engine."""

from __future__ import annotations

import re
import tomllib

import yaml

from grpojob_operator.settings import DEFAULT_ENVIRONMENT_IMAGE, DEFAULT_NEMO_GYM_IMAGE, DEFAULT_RAY_IMAGE, RAY_VERSION
from grpojob_testing import base_image, images, wheelhouse

REPO = images.REPO


def test_images_carry_the_names_the_chart_and_the_operator_default_to():
    chart = yaml.safe_load((REPO / "charts" / "grpojob" / "Chart.yaml").read_text())
    values = yaml.safe_load((REPO / "charts" / "grpojob" / "values.yaml").read_text())
    names = {image.key: image.name for image in images.images()}
    assert names["operator"] == f"{values['image']['repository']}:{chart['appVersion']}"
    assert names["environments"] == DEFAULT_ENVIRONMENT_IMAGE == values["defaults"]["environmentImage"]
    assert names["trainer-cpu"] == f"{DEFAULT_RAY_IMAGE}-cpu"
    assert names["nemo-gym"] == DEFAULT_NEMO_GYM_IMAGE == values["defaults"]["nemoGymImage"]


def test_the_base_is_tagged_with_the_python_image_every_dockerfile_starts_from():
    for image in images.images():
        dockerfile = (REPO / image.dockerfile).read_text()
        python_image = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", dockerfile, re.MULTILINE).group(1)
        assert f"docker.io/library/{python_image}" == base_image.NAME
        if image.target:
            assert re.search(rf"^FROM \S+ AS {image.target}$", dockerfile, re.MULTILINE), image.target
    trainer = next(image for image in images.images() if image.key == "trainer-cpu")
    assert trainer.build_args["WITH_VLLM"] == "false"
    gpu = images.gpu_image()
    assert (gpu.dockerfile, gpu.target, gpu.build_args) == ("Dockerfile", "trainer", {})  # WITH_VLLM=true
    assert gpu.name == DEFAULT_RAY_IMAGE


def test_every_image_runs_the_python_that_nemo_gym_and_the_job_s_ray_cluster_share():
    assert base_image.PYTHON == "3.13" and base_image.SUITE == "trixie"
    assert re.search(r"^FROM \$\{PYTHON_IMAGE\} AS trainer$", (REPO / "Dockerfile").read_text(), re.MULTILINE)


def test_the_gpu_image_locks_the_versions_measured_on_the_h200_and_the_trainer_extras_own_pins():
    locked = dict(requirement.split("==") for requirement in wheelhouse.gpu_requirements())
    measured = {"vllm": "0.26.0", "torch": "2.11.0", "transformers": "5.17.0", "ray": RAY_VERSION}
    assert {name: locked.get(name) for name in measured} == measured
    # vLLM pins its own torch, transformers and fastapi; every other pin of the trainer extra holds.
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extra = [*pyproject["optional-dependencies"]["trainer"], *pyproject["optional-dependencies"]["environment"]]
    for requirement in extra:
        if requirement.startswith("grpojob["):
            continue
        name, version = requirement.split("==")
        name = re.sub(r"\[.*\]", "", name).lower()
        if name not in ("torch", "transformers", "fastapi"):
            assert locked.get(name) == version, requirement
    assert all(re.fullmatch(r"[a-z0-9\-]+==[\w.+]+", requirement) for requirement in wheelhouse.gpu_requirements())


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


def test_every_file_the_dockerfile_copies_is_an_input_of_its_images_and_the_readme_is_not():
    copies = re.findall(r"^COPY (?!.*--from=)(?:--\S+ )*(.+) \S+$", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    copied = [path.rstrip("/") for line in copies for path in line.split()]

    assert "pyproject.toml" in copied and "trainer" in copied
    for path in copied:
        assert any(path == f or f.startswith(path + "/") for f in images.PROJECT_FILES), path
    assert "README.md" not in images.PROJECT_FILES, "a documentation edit would rebuild every image"


def test_an_image_is_rebuilt_when_a_source_file_changes(monkeypatch):
    operator = images.images()[0]
    before = images.inputs_hash(operator, "base")
    assert images.inputs_hash(operator, "other-base") != before
    assert "operator/grpojob_operator/children/raycluster.py" in images.context_files(operator.files)
    real_read_bytes = type(REPO).read_bytes

    def edited(path, *args):
        data = real_read_bytes(path, *args)
        return data + b"# edited" if path.name == "raycluster.py" else data

    monkeypatch.setattr(type(REPO), "read_bytes", edited)
    assert images.inputs_hash(operator, "base") != before


def test_containers_get_ulimits_this_machine_lets_runc_set():
    flags = images.ulimits()
    assert [flag.split("=")[1] for flag in flags] == ["nofile", "nproc"]
    for flag in flags:
        soft, hard = flag.rsplit("=", 1)[1].split(":")
        assert soft == hard and int(hard) > 0
