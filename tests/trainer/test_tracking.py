"""`spec.logging.mlflow` and `spec.logging.wandb`: a real MLflow tracking server (SQLite backend, started
here) gets one run per attempt with the spec as parameters and every step's numbers; W&B in offline mode
writes the run's records (config and history) under the attempt's log directory."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from grpojob_api import v1alpha1 as api
from grpojob_api.admission import parse_job
from grpojob_testing.cluster import wait_until
from grpojob_trainer.net.loopback import free_port
from grpojob_trainer.observability.metrics import MetricsLogger
from grpojob_trainer.observability.tracking import MlflowSink, WandbSink, job_params

STEPS = [
    {"rollout/reward/mean": 0.25, "time/step": 3.0, "phase": "train", "per_sample": [1.0, 0.0]},
    {"rollout/reward/mean": 0.5, "time/step": 2.5, "phase": "train", "per_sample": [1.0, 1.0]},
    {"rollout/reward/mean": 0.75, "time/step": 2.0, "phase": "train", "per_sample": [1.0, 1.0]},
]


def a_job(logging: dict[str, Any]) -> api.GRPOJob:
    return parse_job(
        {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "metadata": {"name": "demo"},
            "spec": {
                "model": {"path": "/models/tiny"},
                "dataset": {"path": "rows.jsonl"},
                "environments": [{"name": "arith"}],
                "generation": {"maxModelLen": 256, "maxNewTokens": 16},
                "grpo": {"maxSteps": 3, "importanceSamplingCap": None},
                "logging": logging,
            },
        }
    )


def test_the_spec_as_parameters_keeps_only_primitive_values():
    params = job_params(a_job({}))
    assert params["name"] == "demo"
    assert params["grpo.maxSteps"] == 3 and params["generation.temperature"] == 1.0
    assert params["training.optimizer.name"] == "adamw"
    assert not any(key.startswith("environments") for key in params)  # a list
    assert "grpo.importanceSamplingCap" not in params  # a null
    assert all(isinstance(value, int | float | bool | str) for value in params.values())


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`mlflow server` on a SQLite file and a free loopback port; its URL."""
    home = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}", "--default-artifact-root", str(home / "a")]
    log = (home / "server.log").open("w")
    environment = os.environ | {"PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=home, env=environment)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if server.poll() is not None:
            pytest.fail(f"mlflow server exited with {server.returncode}: {(home / 'server.log').read_text()[-3000:]}")
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, "the MLflow server to answer /health", 180)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_mlflow_gets_one_run_per_attempt_with_the_spec_as_parameters_and_every_steps_numbers(
    mlflow_server: str, tmp_path: Path
):
    from mlflow import MlflowClient

    job = a_job({"mlflow": {"trackingUri": mlflow_server, "experiment": "grpo-tests"}})
    with MetricsLogger(tmp_path, tensorboard=False, sinks=[MlflowSink(job.spec.logging.mlflow, job, 2)]) as logger:
        for step, metrics in enumerate(STEPS, start=1):
            logger.log(step, metrics)

    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("grpo-tests")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "demo-attempt-2" and run.info.status == "FINISHED"
    assert run.data.tags["grpojob"] == "demo" and run.data.tags["grpojob.attempt"] == "2"
    assert run.data.params["grpo.maxSteps"] == "3" and run.data.params["model.path"] == "/models/tiny"
    assert not any(key.startswith("environments") for key in run.data.params)
    history = client.get_metric_history(run.info.run_id, "rollout/reward/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert set(run.data.metrics) == {"rollout/reward/mean", "time/step"}  # strings and lists are not metrics


def test_a_failed_attempt_ends_its_mlflow_run_as_failed(mlflow_server: str, tmp_path: Path):
    from mlflow import MlflowClient

    job = a_job({"mlflow": {"trackingUri": mlflow_server}})  # the experiment defaults to the job's name
    sink = MlflowSink(job.spec.logging.mlflow, job, 1)
    with pytest.raises(RuntimeError), MetricsLogger(tmp_path, tensorboard=False, sinks=[sink]) as logger:
        logger.log(1, STEPS[0])
        raise RuntimeError("every rollout failed")
    client = MlflowClient(tracking_uri=mlflow_server)
    (run,) = client.search_runs([client.get_experiment_by_name("demo").experiment_id])
    assert run.info.status == "FAILED"


def wandb_records(path: Path) -> list[Any]:
    """The records of a W&B run file: W&B's 7-byte header, then LevelDB's log format (32 KiB blocks of
    chunks, each with a checksum, a length and whether it is a whole record or a part), protobuf records."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:16]
    block, position, pending, records = 32768, 7, b"", []
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            position += left
            continue
        length, kind = int.from_bytes(data[position + 4 : position + 6], "little"), data[position + 6]
        if kind == 0:  # zeros preallocated after the last chunk
            break
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or the last part of one
            record = Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_wandb_offline_writes_the_run_with_the_spec_as_config_and_every_steps_scalars(tmp_path: Path):
    job = a_job({"wandb": {"project": "grpo", "mode": "offline"}})
    run_dir = tmp_path / "logs" / "demo" / "attempt-1"
    sink = WandbSink(job.spec.logging.wandb, job, 1, run_dir)
    with MetricsLogger(run_dir, tensorboard=False, sinks=[sink]) as logger:
        for step, metrics in enumerate(STEPS, start=1):
            logger.log(step, metrics)

    (run_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    # W&B's service process writes the file; its last record, `exit`, may land just after `finish` returns.
    wait_until(lambda: any(r.HasField("exit") for r in wandb_records(run_file)), "the run's exit record", 60)
    records = wandb_records(run_file)
    (run,) = [r.run for r in records if r.HasField("run")]
    assert (run.project, run.display_name, run.run_group) == ("grpo", "demo-attempt-1", "demo")
    config = {item.key: item.value_json for item in run.config.update}
    config |= {i.key: i.value_json for r in records if r.HasField("config") for i in r.config.update}
    assert config["grpo.maxSteps"] == "3" and config["model.path"] == '"/models/tiny"'
    history = {}
    for record in records:
        if record.HasField("history"):
            items = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
            history[int(items["_step"])] = items
    assert [float(history[step]["rollout/reward/mean"]) for step in (1, 2, 3)] == [0.25, 0.5, 0.75]
    assert history[2]["phase"] == '"train"' and "per_sample" not in history[2]
