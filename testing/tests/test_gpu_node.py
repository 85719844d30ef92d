"""What travels to the GPU machine (`grpojob_testing.gpu_node`): parts of a bounded size that come back
together as they were, with Python alone; and which programs a GPU node needs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grpojob_testing import build, cluster, gpu_node


def test_parts_of_a_bounded_size_come_back_together_as_they_were(tmp_path: Path):
    source = tmp_path / "source"
    (source / "crds").mkdir(parents=True)
    (source / "program").write_bytes(os.urandom(300_000))  # incompressible: several parts
    (source / "crds" / "a.yaml").write_text("kind: CustomResourceDefinition\n")
    members = [(source / "program", "bin/x/program"), (source / "crds", "bin/x/crds")]
    parts = gpu_node.write_parts(members, tmp_path / "parts", part_bytes=100_000)
    assert len(parts) == 4 and all(p.stat().st_size <= 100_000 for p in parts)
    assert [p.relative_to(tmp_path / "parts").as_posix() for p in parts][:2] == ["p0/part_00", "p1/part_01"]
    flat = tmp_path / "flat"  # as the device machine keeps them: every part in one folder
    flat.mkdir()
    for part in parts:
        (flat / part.name).write_bytes(part.read_bytes())
    gpu_node.read_parts(flat, tmp_path / "out")
    assert (tmp_path / "out/bin/x/program").read_bytes() == (source / "program").read_bytes()
    assert (tmp_path / "out/bin/x/crds/a.yaml").read_text() == "kind: CustomResourceDefinition\n"


def test_the_programs_carried_are_those_a_cluster_with_a_gpu_node_builds():
    carried = set(gpu_node.PROGRAMS)
    components = set(build.load_components())
    not_built = {*cluster.NOT_RUN_BY_A_CLUSTER, "kwok", *cluster.OPTIONAL_COMPONENTS}
    assert carried == components - not_built


def test_installing_the_operator_wheels_keeps_the_commands_the_gpu_wheels_installed(tmp_path: Path):
    site_packages = tmp_path / "site-packages"
    (site_packages / "bin").mkdir(parents=True)
    (site_packages / "bin" / "ray").write_text("ray")
    (site_packages / "kopf").mkdir()
    (site_packages / "kopf" / "old.py").write_text("old")
    installed = tmp_path / "installed"
    (installed / "bin").mkdir(parents=True)
    (installed / "bin" / "kopf").write_text("kopf")
    (installed / "kopf").mkdir()
    (installed / "kopf" / "new.py").write_text("new")

    gpu_node.merge_site_packages(installed, site_packages)

    assert sorted(p.name for p in (site_packages / "bin").iterdir()) == ["kopf", "ray"]
    assert [p.name for p in (site_packages / "kopf").iterdir()] == ["new.py"]


def test_the_ray_pods_get_everything_ray_default_requires_so_its_dashboard_agent_answers_probes():
    """KubeRay's probes ask the dashboard agent for /api/healthz, which Ray serves only with ray[default]."""
    from importlib import metadata

    from packaging.requirements import Requirement

    requirements = [Requirement(line) for line in metadata.requires("ray") or []]
    wanted = {
        gpu_node._normalised_name(r.name)
        for r in requirements
        if r.marker is not None and r.marker.evaluate({"extra": "default", "python_version": "3.12"})
    }
    carried = {gpu_node._normalised_name(n) for n in (*gpu_node.RAY_POD_WHEELS, *gpu_node.RAY_DEFAULT_ELSEWHERE)}
    assert wanted and wanted <= carried, sorted(wanted - carried)


def test_the_carried_wheels_are_pinned_as_the_gpu_image_pins_them(tmp_path: Path):
    pins = gpu_node.locked_pins((*gpu_node.RAY_POD_WHEELS, *gpu_node.TESTING_WHEELS))
    assert "aiohttp-cors==0.8.1" in pins and all("==" in pin for pin in pins)
    with pytest.raises(ValueError, match="no-such-package"):
        gpu_node.locked_pins(("opencensus", "no-such-package"))
