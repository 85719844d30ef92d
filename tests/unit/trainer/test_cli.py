"""`grpojob train` leaves the reason it failed as the container's termination message (the file the kubelet
creates at /dev/termination-log), where the operator reads it into the GRPOJob's status."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpojob_api import endpoints
from grpojob_api.admission import parse_job
from grpojob_api.endpoints import TrainerEnv
from grpojob_api.progress import is_preemption, is_worker_lost
from grpojob_operator.children.endpoints import endpoints_data
from grpojob_operator.children.trainer import render_job_config
from grpojob_operator.settings import OperatorSettings
from grpojob_trainer import cli

from ..operator.conftest import job_body

JOB = parse_job(job_body())


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """The trainer's config file, as the operator renders it."""
    path = tmp_path / "grpojob.yaml"
    path.write_text(render_job_config(JOB))
    return path


@pytest.fixture
def termination_log(tmp_path: Path) -> Path:
    """The termination log as the kubelet hands it to a container: an empty file."""
    path = tmp_path / "termination-log"
    path.touch()
    return path


def trainer_pod_environment(monkeypatch: pytest.MonkeyPatch, metrics_port: int) -> None:
    """The trainer pod's environment: the endpoints and its own variables."""
    for name, value in endpoints_data(JOB, OperatorSettings(), "10.0.0.7", 1).items():
        monkeypatch.setenv(name, value)
    own = TrainerEnv(
        progress_config_map="demo-config",
        model_path="/models/qwen",
        dataset_paths=["/data/train.jsonl"],
        checkpoint_dir="/checkpoints",
        output_dir="/output",
        metrics_port=metrics_port,
    )
    for variable in own.env():
        monkeypatch.setenv(variable["name"], variable["value"])
    monkeypatch.delenv(endpoints.GRPOJOB_POD_ATTEMPT, raising=False)


def test_a_usage_error_is_the_termination_message(
    config: Path, termination_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(endpoints.RAY_GCS_ADDRESS, raising=False)
    assert cli.main(["train", "--config", str(config), "--termination-log", str(termination_log)]) == 2
    message = termination_log.read_text()
    assert message.startswith("the <job>-endpoints ConfigMap: RAY_GCS_ADDRESS is missing")
    assert "\n" not in message


def test_an_unexpected_error_leaves_the_last_line_of_its_exception_and_still_raises(
    config: Path, termination_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:  # the trainer's metrics port is in use
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        trainer_pod_environment(monkeypatch, taken.getsockname()[1])
        with pytest.raises(OSError, match="Address already in use"):
            cli.main(["train", "--config", str(config), "--termination-log", str(termination_log)])
    assert termination_log.read_text() == "OSError: [Errno 98] Address already in use"


def test_outside_a_pod_no_termination_log_is_created(tmp_path: Path, config: Path, monkeypatch) -> None:
    monkeypatch.delenv(endpoints.RAY_GCS_ADDRESS, raising=False)
    absent = tmp_path / "absent"
    assert cli.main(["train", "--config", str(config), "--termination-log", str(absent)]) == 2
    assert not absent.exists()


def test_a_long_reason_is_written_as_one_bounded_line(termination_log: Path) -> None:
    cli.write_termination_message(termination_log, "first line\n  second line " + "x" * 5000)
    message = termination_log.read_text()
    assert message.startswith("first line second line xxx") and len(message) == cli.TERMINATION_MESSAGE_LIMIT


def test_a_lost_ray_head_is_the_termination_message_of_the_process_that_exits_at_once(
    config: Path, termination_log: Path
) -> None:
    # main() ends the process itself (os._exit) on a lost head, so it runs in a process of its own.
    script = f"""
import sys
from grpojob_trainer import cli
from grpojob_trainer.errors import RayHeadLost

def lost(config, **_):
    raise RayHeadLost("the Ray head node 0123456789ab is gone from the cluster (its pod was replaced)")

cli.train_in_cluster = lost
cli.main(["train", "--config", {str(config)!r}, "--termination-log", {str(termination_log)!r}])
sys.exit(5)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert (
        termination_log.read_text() == "the Ray head node 0123456789ab is gone from the cluster (its pod was replaced)"
    )


def test_a_trainer_told_to_stop_says_it_was_preempted_where_the_operator_reads_it(
    config: Path, termination_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def told_to_stop(config: Path, stop: object) -> int:
        os.kill(os.getpid(), signal.SIGTERM)  # the kubelet's notice, as the pod is evicted
        time.sleep(60)
        return 0

    monkeypatch.setattr(cli, "train_in_cluster", told_to_stop)

    assert cli.main(["train", "--config", str(config), "--termination-log", str(termination_log)]) == 143
    assert termination_log.read_text() == "preempted before the first step; no checkpoint yet"
    assert is_preemption(f"Error: {termination_log.read_text()}"), "the operator retries it uncounted"


def test_a_trainer_that_lost_a_ray_worker_with_its_node_says_so_where_the_operator_reads_it(
    config: Path, termination_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from grpojob_trainer.cluster.workers import LostWorker, Place, WorkerName
    from grpojob_trainer.training.stop import WorkerLost

    place = Place("node-2", "10.244.0.12", "demo-policy-worker-x7k2p", in_a_pod=True)

    def lost_its_worker(config: Path, stop: object) -> int:
        raise WorkerLost(LostWorker(WorkerName("policy", 0), place, True, ""), 7, Path("/checkpoints/demo/step_6"))

    monkeypatch.setattr(cli, "train_in_cluster", lost_its_worker)

    assert cli.main(["train", "--config", str(config), "--termination-log", str(termination_log)]) == 75
    assert termination_log.read_text() == (
        "a policy worker was lost at step 8 (pod demo-policy-worker-x7k2p, node 10.244.0.12: its node left the Ray "
        "cluster); the retry resumes from checkpoint /checkpoints/demo/step_6"
    )
    assert is_worker_lost(f"Error: {termination_log.read_text()}"), "the operator retries it uncounted"
