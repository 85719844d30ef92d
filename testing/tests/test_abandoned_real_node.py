"""A real node left behind by a pytest session killed before its teardown is found, so the next real
node can tear it down first (one real node per host)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from grpojob_testing.cluster import abandoned_real_node_clusters


def state(root: Path, name: str, real_node: dict[str, str] | None) -> Path:
    state_dir = root / name
    state_dir.mkdir()
    (state_dir / "cluster.json").write_text(json.dumps({"ports": {}, "pids": {}, "real_node": real_node}))
    return state_dir


def a_finished_pid() -> int:
    finished = subprocess.Popen(["true"])
    finished.wait()
    return finished.pid


def test_only_real_nodes_of_pytest_sessions_that_are_gone_are_abandoned(tmp_path: Path):
    gone = a_finished_pid()
    abandoned = state(tmp_path, f"pytest-{gone}", {"net.ipv4.ip_forward": "0"})
    state(tmp_path, f"pytest-{os.getpid()}", {"net.ipv4.ip_forward": "0"})  # its pytest still runs
    state(tmp_path, f"pytest-{a_finished_pid()}", None)  # no real node
    state(tmp_path, "default", {"net.ipv4.ip_forward": "0"})  # `cluster up`'s, owned by no pytest

    assert abandoned_real_node_clusters(tmp_path) == [abandoned]
