"""On Kubernetes the trainer pod is outside the RayCluster: it joins at RAY_GCS_ADDRESS as a node with
no resources, reads the GCS address back, and its actors land on the worker groups' resources.
Here a `ray start --head` process stands in for the RayCluster's head."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpojob_trainer.net.loopback import free_port

RAY = str(Path(sys.executable).with_name("ray"))
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_DISABLE_USAGE_STATS": "1"}

PROBE = """
import json, ray
from grpojob_trainer.cluster import connection
gcs = connection.join("127.0.0.1:%d")
nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
@ray.remote(num_cpus=0, resources={"policy": 1})
def policy_node():
    return sorted(k for k in ray.get_runtime_context().get_assigned_resources())
print(json.dumps({"gcs": gcs, "nodes": nodes, "assigned": ray.get(policy_node.remote())}))
"""

HEAD_CHECK = """
import signal, subprocess, sys
from grpojob_trainer.cluster import connection
from grpojob_trainer.errors import RayHeadLost
connection.join("127.0.0.1:%(port)d")
head = connection.HeadWatch(timeout_s=10)
head.check()
print("the head answers", flush=True)
subprocess.run(["pkill", "-KILL", "-f", "gcs_server .*--gcs_server_port=%(port)d( |$)"], check=True)
try:
    head.check()
except RayHeadLost as error:
    print(f"lost: {error}", flush=True)
    connection.disconnect(head)
    connection.exit_without_ray(3)
"""


@pytest.fixture
def ray_head():
    port = free_port()
    resources = json.dumps({"generation": 1, "policy": 1})
    start = [RAY, "start", "--head", f"--port={port}", "--num-cpus=1", f"--resources={resources}"]
    subprocess.run([*start, "--include-dashboard=false", "--disable-usage-stats"], env=ENV, check=True, timeout=120)
    yield port
    subprocess.run([RAY, "stop", "--force"], env=ENV, timeout=120)


def test_the_trainer_joins_the_ray_cluster_as_a_zero_resource_node(ray_head: int):
    result = subprocess.run(
        [sys.executable, "-c", PROBE % ray_head], env=ENV, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["gcs"].endswith(f":{ray_head}"), "the GCS address is read back from the runtime context"
    assert len(report["nodes"]) == 2
    joined = next(n for n in report["nodes"] if "policy" not in n)
    assert joined.get("CPU", 0) == 0 and joined.get("GPU", 0) == 0, "the trainer's node offers nothing"
    assert report["assigned"] == ["policy"], "the policy actor is placed by the worker group's resource"


def test_joining_a_cluster_that_is_not_there_fails_clearly():
    from grpojob_trainer.cluster import connection

    with pytest.raises(RuntimeError, match=r"could not join the Ray cluster at 127\.0\.0\.1:"):
        connection.join(f"127.0.0.1:{free_port()}", timeout_s=5)


def test_a_trainer_whose_ray_head_dies_stops_at_the_next_check_and_exits(ray_head: int):
    """Actors keep answering each other without the GCS, so only the check between steps notices the head
    is gone; it must raise within its timeout and the process must exit with our code, before Ray's own
    fatal exit a minute after the GCS died (code 1, which a slow teardown on a busy machine used to reach)."""
    result = subprocess.run(
        [sys.executable, "-c", HEAD_CHECK % {"port": ray_head}], env=ENV, capture_output=True, text=True, timeout=180
    )
    assert "the head answers" in result.stdout, result.stderr[-3000:]
    assert result.returncode == 3, result.stderr[-3000:]
    assert "lost: the Ray GCS did not answer within 10s" in result.stdout
