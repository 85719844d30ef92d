"""The real GPU node's device plugin (testing/go/device-plugin): built like every other cluster program,
pinned to the kubelet it talks to, and its Go tests (Allocate's answer, registration with a kubelet's
Registration service, ListAndWatch) pass. On a GPU machine `make e2e-gpu` runs it against the real kubelet."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator

import pytest

from grpojob_testing import build, node, node_images
from grpojob_testing.cluster import Cluster, clusters_root, wait_until


def test_the_device_plugin_speaks_the_device_plugin_api_of_the_pinned_kubelet():
    components = build.load_components()
    assert components["device-plugin"].module == "k8s.io/kubelet"
    assert components["device-plugin"].version == components["kubernetes"].staging_version


def test_the_device_plugins_go_tests_pass():
    plugin = build.load_components()["device-plugin"]
    result = subprocess.run(
        ["go", "test", "-count=1", "."], cwd=plugin.wrapper_dir, env=build.go_env(), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_device_plugin_builds_into_the_cache():
    programs = build.build(build.load_components()["device-plugin"])
    assert (programs / "device-plugin").is_file()


@pytest.fixture(scope="module")
def node_with_fake_gpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A cluster whose real node advertises two "GPUs": character devices made here (/dev/null's numbers) named
    like NVIDIA's, and a control node, found by the plugin through its device glob."""
    if os.geteuid() != 0:
        pytest.skip("a real node needs root")
    try:
        node.preflight()
    except RuntimeError as error:
        pytest.skip(str(error))
    devices = tmp_path_factory.mktemp("dev")
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        os.mknod(devices / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    cluster = Cluster(clusters_root() / f"pytest-{os.getpid()}-device-plugin")
    cluster.up(cpu_nodes=0, gpu_nodes=0, real_node=True, kwok=False, gpu_device_glob=str(devices / "nvidia[0-9]*"))
    try:
        yield cluster
    finally:
        cluster.down()


def test_a_pod_asking_for_a_gpu_gets_one_device_node_from_the_plugin_through_the_real_kubelet(node_with_fake_gpus):
    cluster = node_with_fake_gpus
    allocatable = json.loads(cluster.kubectl("get", "node", node.NODE_NAME, "-o", "jsonpath={.status.allocatable}"))
    assert allocatable["nvidia.com/gpu"] == "2"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu", "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "probe",
                    "image": node_images.PROBE_IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                    "args": ["devices", "/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }
    cluster.apply_objects([pod])

    def finished() -> bool:
        phase = cluster.kubectl("get", "pod", "gpu", "-o", "jsonpath={.status.phase}", check=False)
        return phase in ("Succeeded", "Failed")

    wait_until(finished, "the GPU pod to finish", 120, 0.5)
    log = cluster.kubectl("logs", "gpu")
    # One of the two devices, and only it (the probe fails on the one it was not given), with the control node.
    given = [name for name in ("nvidia0", "nvidia1") if f"/dev/{name} char-device=true" in log]
    assert "/dev/nvidiactl char-device=true" in log, log
    assert len(given) == 1, log
    assert f"NVIDIA_VISIBLE_DEVICES={given[0]}" in log and "LD_LIBRARY_PATH=/usr/local/nvidia/lib64" in log, log
    assert cluster.kubectl("get", "pod", "gpu", "-o", "jsonpath={.status.phase}") == "Failed", "nvidia1 or 0 missing"
