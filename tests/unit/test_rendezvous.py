"""A pod never uses `<job>-endpoints` of an older attempt than its own: it says so in one line and
re-reads the mounted copy until the operator's write of its attempt arrives (the trainer and the
environment servers through `grpojob_trainer.cluster.rendezvous`, NeMo Gym pods through their launch script)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpojob_api import endpoints
from grpojob_api.admission import parse_job
from grpojob_api.endpoints import ContractError
from grpojob_api.nemo_gym import CONFIG_DIR, CONFIG_FILE, IMAGE_SERVERS_DIR
from grpojob_operator.children.endpoints import endpoints_data
from grpojob_operator.children.environments import build_environment_deployment
from grpojob_operator.children.nemo_gym import LAUNCH_SCRIPT
from grpojob_operator.children.trainer import build_trainer_job
from grpojob_operator.settings import OperatorSettings
from grpojob_trainer.cluster.rendezvous import StaleEndpoints, current_endpoints

from .operator.conftest import job_body

SETTINGS = OperatorSettings(cluster_domain="cluster.example")
JOB = parse_job(job_body())


def endpoints_of(attempt: int, head_ip: str) -> dict[str, str]:
    return endpoints_data(JOB, SETTINGS, head_ip, attempt)


def project(directory: Path, data: dict[str, str]) -> None:
    """Write a ConfigMap's data as the kubelet projects it into a volume: one file per key."""
    directory.mkdir(exist_ok=True)
    for key, value in data.items():
        (directory / key).write_text(value)


def test_endpoints_of_the_pods_own_attempt_or_a_newer_one_are_used_as_they_are(tmp_path: Path):
    for own in (2, 1):
        environ = {**endpoints_of(2, "10.0.0.7"), endpoints.GRPOJOB_POD_ATTEMPT: str(own)}
        assert current_endpoints(environ, tmp_path, sleep=pytest.fail).ray_head_pod_ip == "10.0.0.7"
    # `grpojob run` and other processes outside a job's pods have no attempt of their own.
    assert current_endpoints(endpoints_of(1, "10.0.0.7"), tmp_path, sleep=pytest.fail).attempt == 1


def test_an_older_attempts_endpoints_are_refused_in_one_line_and_re_read_until_current(tmp_path: Path, caplog):
    environ = {**endpoints_of(1, "10.0.0.7"), endpoints.GRPOJOB_POD_ATTEMPT: "2"}
    project(tmp_path, endpoints_of(1, "10.0.0.7"))  # the kubelet has not caught up yet either
    waits = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 3:  # the operator's write of attempt 2 reaches the volume
            project(tmp_path, endpoints_of(2, "10.0.0.9"))

    with caplog.at_level(logging.INFO):
        found = current_endpoints(environ, tmp_path, sleep=sleep, poll_s=2)
    assert (found.attempt, found.ray_head_pod_ip) == (2, "10.0.0.9")
    assert len(waits) == 3
    (refusal,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "\n" not in refusal
    assert refusal.startswith("refusing demo-endpoints of attempt 1: this pod belongs to attempt 2")


def test_endpoints_that_never_catch_up_end_the_pod_with_the_reason(tmp_path: Path):
    environ = {**endpoints_of(1, "10.0.0.7"), endpoints.GRPOJOB_POD_ATTEMPT: "3"}
    project(tmp_path, endpoints_of(2, "10.0.0.8"))
    with pytest.raises(StaleEndpoints, match="refusing demo-endpoints of attempt 2: this pod belongs to attempt 3"):
        current_endpoints(environ, tmp_path, sleep=lambda _: None, timeout_s=10, poll_s=2)


def test_a_malformed_pod_attempt_is_refused_by_name(tmp_path: Path):
    environ = {**endpoints_of(1, "10.0.0.7"), endpoints.GRPOJOB_POD_ATTEMPT: "two"}
    with pytest.raises(ContractError, match="GRPOJOB_POD_ATTEMPT: must be a whole number"):
        current_endpoints(environ, tmp_path)


def test_every_pod_that_reads_the_endpoints_carries_its_attempt_and_the_mounted_copy():
    env = JOB.spec.environments[0]
    templates = {
        "trainer": build_trainer_job(JOB, SETTINGS, 3)["spec"]["template"],
        "environment": build_environment_deployment(JOB, env, SETTINGS, 3)["spec"]["template"],
    }
    for role, template in templates.items():
        (container,) = template["spec"]["containers"]
        assert {"name": endpoints.GRPOJOB_POD_ATTEMPT, "value": "3"} in container["env"], role
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == endpoints.ENDPOINTS_MOUNT)
        volume = next(v for v in template["spec"]["volumes"] if v["name"] == mount["name"])
        assert volume["configMap"]["name"] == "demo-endpoints", role


SERVERS_SCRIPT = Path(__file__).parents[2] / "images" / "nemo-gym" / "servers.py"


def run_launch_script(
    tmp_path: Path, environ: dict[str, str], mounted: dict[str, str], config: str = "{}\n"
) -> subprocess.CompletedProcess:
    """The NeMo Gym pod's launch script with NeMo Gym config ``config`` (its `env.yaml`), `ray` and `gym`
    standing in as programs that print their arguments, the image's `grpojob-servers`, and its directories
    moved under ``tmp_path`` (the prepared servers' environments under `servers/`, none unless a test makes
    them; the working directory is `work/`)."""
    tmp_path.mkdir(exist_ok=True)
    bin_dir, config_dir, mount, work = tmp_path / "bin", tmp_path / "config", tmp_path / "endpoints", tmp_path / "work"
    for directory in (bin_dir, config_dir, work):
        directory.mkdir(exist_ok=True)
    project(mount, mounted)
    (config_dir / CONFIG_FILE).write_text(config)
    programs = {program: f'echo {program} "$@"' for program in ("ray", "gym")}
    programs["grpojob-servers"] = f'exec {sys.executable} {SERVERS_SCRIPT} "$@"'
    for program, body in programs.items():
        (bin_dir / program).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / program).chmod(0o755)
    script = LAUNCH_SCRIPT.replace(CONFIG_DIR, str(config_dir)).replace(IMAGE_SERVERS_DIR, str(tmp_path / "servers"))
    script = script.replace(endpoints.ENDPOINTS_MOUNT, str(mount)).replace("sleep 2", "sleep 0.1")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", **environ}
    return subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=30)


def test_a_nemo_gym_pod_joins_the_ray_cluster_of_its_own_attempt_only(tmp_path: Path):
    stale = {**endpoints_of(1, "10.0.0.7"), "RAY_GCS_ADDRESS": "old-head:6379"}
    current = {**endpoints_of(2, "10.0.0.9"), "RAY_GCS_ADDRESS": "new-head:6379"}
    done = run_launch_script(tmp_path, {**stale, endpoints.GRPOJOB_POD_ATTEMPT: "2"}, current)
    assert done.returncode == 0, done.stderr
    assert "ray start --address=new-head:6379" in done.stdout and "old-head" not in done.stdout
    (refusal,) = done.stderr.splitlines()
    assert refusal.startswith("refusing demo-endpoints of attempt 1: this pod belongs to attempt 2")

    again = run_launch_script(tmp_path / "current", {**current, endpoints.GRPOJOB_POD_ATTEMPT: "2"}, current)
    assert again.returncode == 0 and again.stderr == "" and "--address=new-head:6379" in again.stdout
