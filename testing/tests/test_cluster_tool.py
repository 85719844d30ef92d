"""The test-cluster tool by hand: `up` prints a kubeconfig whose nodes include 8-GPU fake nodes,
and `down` leaves no process behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from grpojob_testing import build
from grpojob_testing.cluster import Cluster, clusters_root, process_alive

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        bool(os.environ.get("GRPOJOB_TEST_KUBECONFIG")),
        reason="GRPOJOB_TEST_KUBECONFIG points the suite at an existing cluster; this test starts its own",
    ),
]


def run_tool(*args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "grpojob_testing.cluster", *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    ).stdout.strip()


def test_up_lists_gpu_nodes_and_down_leaves_no_process():
    name = f"cli-{os.getpid()}"
    kubeconfig = run_tool("up", "--name", name, "--cpu-nodes", "1", "--gpu-nodes", "2")
    try:
        assert run_tool("kubeconfig", "--name", name) == kubeconfig
        kubectl = build.load_components()["kubernetes"].bin_dir / "kubectl"
        nodes = json.loads(
            subprocess.run(
                [str(kubectl), "--kubeconfig", kubeconfig, "get", "nodes", "-o", "json"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )["items"]
        gpus = {n["metadata"]["name"]: n["status"]["capacity"].get("nvidia.com/gpu") for n in nodes}
        assert gpus == {"kwok-cpu-0": None, "kwok-gpu-0": "8", "kwok-gpu-1": "8"}
        pids = Cluster.named(name).pids
        assert set(pids) == {
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
            "kuberay-operator",
            "kueue",
        }
        assert all(process_alive(pid) for pid in pids.values())
    finally:
        run_tool("down", "--name", name)
    assert not any(process_alive(pid) for pid in pids.values())
    assert not (clusters_root() / name).exists()
