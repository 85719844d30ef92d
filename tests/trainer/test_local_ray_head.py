"""`grpojob run`'s local Ray head: Ray's servers listen on every address of the machine, so the head requires
a token of the run, and a client on the network without it is refused, even where the shell disabled Ray's
token authentication."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HEAD = """
import json, os, sys
from grpojob_trainer.cluster import connection
gcs = connection.start_local({"generation": 1, "policy": 1})
print(json.dumps({"gcs": gcs, "token": os.environ.get("RAY_AUTH_TOKEN")}), flush=True)
sys.stdin.readline()
"""

CLIENT = "import ray, sys; ray.init(address=sys.argv[1]); print('joined', len(ray.nodes()))"


def connect(gcs: str, home: Path, token: str | None) -> subprocess.CompletedProcess:
    """A Ray client of another user (its own HOME, so no token file of ours) connecting to ``gcs``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env |= {"HOME": str(home), "RAY_gcs_server_port_wait_time_s": "1", "RAY_DISABLE_USAGE_STATS": "1"}
    if token is not None:
        env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    return subprocess.run([sys.executable, "-c", CLIENT, gcs], env=env, capture_output=True, text=True, timeout=120)


def test_the_local_head_refuses_a_client_without_the_runs_token(tmp_path: Path):
    home, other = tmp_path / "home", tmp_path / "other"
    home.mkdir()
    other.mkdir()
    env = {**os.environ, "HOME": str(home), "RAY_AUTH_MODE": "disabled", "RAY_DISABLE_USAGE_STATS": "1"}
    head = subprocess.Popen(
        [sys.executable, "-c", HEAD], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        started = json.loads(head.stdout.readline())
        refused = connect(started["gcs"], other, token=None)
        assert refused.returncode != 0 and "InvalidAuthToken" in refused.stderr, refused.stdout + refused.stderr
        joined = connect(started["gcs"], other, token=started["token"])
        assert joined.returncode == 0 and "joined 1" in joined.stdout, joined.stderr[-3000:]
    finally:
        head.communicate("\n", timeout=120)
    assert not (home / ".ray").exists(), "the run's token is in no file another user could read"
