"""Every program of the test cluster is pinned once, in testing/versions.toml, and the wrapper
modules that build them agree with it."""

from __future__ import annotations

import dataclasses

from grpojob_testing import build, nodes


def test_committed_wrapper_modules_agree_with_versions_toml():
    for component in build.load_components().values():
        assert build.mismatches(component) == [], component.name


def test_a_version_bump_without_repinning_is_caught():
    kuberay = build.load_components()["kuberay"]
    bumped = dataclasses.replace(kuberay, version="v9.9.9")
    assert "versions.toml says v9.9.9" in build.mismatches(bumped)[0]


def test_every_kubernetes_staging_module_is_replaced_by_its_published_release():
    kubernetes = build.load_components()["kubernetes"]
    assert kubernetes.staging_version == "v0." + kubernetes.version.removeprefix("v1.")
    missing = dataclasses.replace(kubernetes, staging_version="v0.1.0")
    assert len(build.mismatches(missing)) == len(build.KUBERNETES_STAGING_MODULES)


def test_kubernetes_version_ldflags_report_the_pinned_release():
    kubernetes = build.load_components()["kubernetes"]
    flags = kubernetes.ldflags()
    assert f"k8s.io/component-base/version.gitVersion={kubernetes.version}" in flags
    assert "k8s.io/component-base/version.gitMinor=34" in flags


def test_build_cache_lives_outside_the_repository_and_is_keyed_by_version():
    etcd = build.load_components()["etcd"]
    assert build.TESTING_DIR.parent not in etcd.bin_dir.parents
    assert etcd.bin_dir.name.startswith(f"etcd-{etcd.version}-")


def test_fake_fleet_has_cpu_nodes_and_tainted_8_gpu_nodes():
    fleet = nodes.fake_nodes(cpu_nodes=2, gpu_nodes=4)
    gpu = [n for n in fleet if nodes.GPU_RESOURCE in n["status"]["capacity"]]
    cpu = [n for n in fleet if nodes.GPU_RESOURCE not in n["status"]["capacity"]]
    assert len(cpu) == 2 and len(gpu) == 4
    assert all(n["status"]["allocatable"][nodes.GPU_RESOURCE] == "8" for n in gpu)
    assert all(n["spec"]["taints"][0]["key"] == nodes.GPU_RESOURCE for n in gpu)
    assert all(n["metadata"]["annotations"][nodes.KWOK_ANNOTATION] == "fake" for n in fleet)
