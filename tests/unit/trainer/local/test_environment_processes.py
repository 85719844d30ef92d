"""`grpojob run` starts each environment with the command its container would run; the trainer pod waits for
the environments' Services and names the one that does not answer."""

from __future__ import annotations

import resource
import socket
import sys
from pathlib import Path

import pytest

from grpojob_api import v1alpha1 as api
from grpojob_trainer.cli import main
from grpojob_trainer.cluster.rendezvous import wait_for_environments
from grpojob_trainer.errors import EnvironmentNotReady
from grpojob_trainer.local.environment_processes import environment_command


def env(**fields) -> api.EnvironmentSpec:
    return api.EnvironmentSpec.model_validate({"name": "arithmetic", **fields})


def test_command_and_args_run_with_this_interpreter():
    spec = env(command=["python", "-m", "grpojob_trainer.environments"], args=["lookup"])
    assert environment_command(spec) == [sys.executable, "-m", "grpojob_trainer.environments", "lookup"]


def test_args_alone_go_to_the_image_entrypoint():
    assert environment_command(env(args=["lookup"])) == [sys.executable, "-m", "grpojob_trainer.environments", "lookup"]


def test_neither_serves_the_environment_of_that_name():
    assert environment_command(env()) == [sys.executable, "-m", "grpojob_trainer.environments", "arithmetic"]


def test_other_programs_run_as_given():
    assert environment_command(env(command=["/opt/env/serve", "--fast"])) == ["/opt/env/serve", "--fast"]


def test_without_podman_grpojob_run_says_what_a_nemo_gym_environment_needs_before_starting_anything(
    tmp_path, capsys, monkeypatch
):
    example = Path(__file__).resolve().parents[4] / "examples" / "nemo-gym-tool-call.yaml"
    job = tmp_path / "job.yaml"
    job.write_text(example.read_text().replace("configMap: {name: gym-tool-call-rows, key: train.jsonl}", "path: x"))
    monkeypatch.setenv("PATH", str(tmp_path))  # a machine without podman

    assert main(["run", str(job), "--no-progress"]) == 2

    error = capsys.readouterr().err
    assert error.startswith("grpojob: spec.environments[0].nemoGym: `grpojob run` starts NeMo Gym environments in ")
    assert "podman, which is not on PATH: install it" in error
    assert "podman pull ghcr.io/grpojob/nemo-gym:0.1.0" in error


def test_the_trainer_names_the_environment_whose_service_accepts_connections_but_never_answers():
    with socket.create_server(("127.0.0.1", 0)) as silent:  # listens, never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(EnvironmentNotReady, match=rf"^environment math: GET {url}/ did not answer 200 within \ds$"):
            wait_for_environments({"math": url}, timeout_s=0.5, interval_s=0.1)


def test_a_nemo_gym_container_runs_as_its_pod_with_the_config_by_absolute_path(tmp_path, monkeypatch):
    from grpojob_api import nemo_gym
    from grpojob_trainer.local.nemo_gym_containers import OWNER_LABEL, container_command

    monkeypatch.chdir(tmp_path)
    command = container_command("podman", "grpojob-demo-format-1a2b3c", "example/gym:1", Path("runs/demo/format"), 42)

    # A relative volume source would be a named volume to podman, which refuses the name.
    assert f"--volume={tmp_path}/runs/demo/format:{nemo_gym.CONFIG_DIR}:ro,z" in command
    assert {"--network=host", "--user=1000:100", "--read-only", "--pull=never", f"--label={OWNER_LABEL}=42"} <= set(
        command
    )
    assert "--rm" not in command, "the log of a container that stopped must outlive it"
    open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert f"--ulimit=nofile={open_files}:{open_files}" in command, "podman's default may exceed this process's"
    processes = [flag for flag in command if flag.startswith("--ulimit=nproc=")]
    allowed = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    assert len(processes) == 1
    assert allowed == resource.RLIM_INFINITY or int(processes[0].rsplit(":", 1)[1]) <= allowed
    image = command.index("example/gym:1")
    assert command[image - 1] == "--entrypoint=grpojob-supervise"
    assert command[image + 1 : image + 3] == ["/bin/bash", "-c"] and "exec gym env start" in command[image + 3]
