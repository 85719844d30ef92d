"""The real GPU node's device plugin (testing/go/device-plugin): built like every other cluster program,
pinned to the kubelet it talks to, and its Go tests (Allocate's answer, registration with a kubelet's
Registration service, ListAndWatch) pass. On a GPU machine `make e2e-gpu` runs it against the real kubelet."""

from __future__ import annotations

import subprocess

from grpojob_testing import build


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
