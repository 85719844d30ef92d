"""The NeMo Gym image's servers (images/nemo-gym/servers.py), run here on files laid out as in the image:
`prepare`, at build time, makes a server's environment the image's own or fails the build saying what is
missing; `check`, before `gym env start`, stops a pod whose config names a server the image did not prepare,
with one line that says which and how to prepare it, and which the job's EnvironmentsReady quotes."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from grpojob_api import endpoints
from grpojob_api.nemo_gym import config_yaml
from grpojob_api.v1alpha1 import ConditionType
from grpojob_operator.children.nemo_gym import render_config
from grpojob_operator.observe import DeploymentInfo, summarize
from grpojob_operator.plan.conditions import condition

from .operator.children.jobs import AGENT, GYM_ENV, GYM_JOB, TOOL_CALL, gym_endpoints
from .operator.plan.test_nemo_gym import children, plan, with_gym_running
from .test_rendezvous import SERVERS_SCRIPT, run_launch_script


def load_servers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grpojob_servers", SERVERS_SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


servers = load_servers()

POLICY = "responses_api_models/vllm_model"
SIMPLE_AGENT = "responses_api_agents/simple_agent"
TOOL_SERVER = "resources_servers/example_single_tool_call"
# NeMo Gym 0.4.0's files for the tool-call example, as its package holds them (less what locates no server).
PACKAGE = {
    f"{POLICY}/configs/vllm_model_for_training.yaml": (
        "policy_model:\n  responses_api_models:\n    vllm_model:\n      entrypoint: app.py\n"
        "      base_url: ${policy_base_url}\n      return_token_id_information: true\n"
    ),
    TOOL_CALL: (
        "example_single_tool_call:\n  resources_servers:\n    example_single_tool_call:\n      entrypoint: app.py\n"
        f"{AGENT}:\n  responses_api_agents:\n    simple_agent:\n      entrypoint: app.py\n"
        "      resources_server: {type: resources_servers, name: example_single_tool_call}\n"
    ),
    f"{POLICY}/pyproject.toml": '[project]\nname = "vllm_model"\ndependencies = ["nemo-gym[dev]"]\n',
    f"{SIMPLE_AGENT}/requirements.txt": "-e nemo-gym[dev] @ ../../\n",
    f"{TOOL_SERVER}/requirements.txt": "-e nemo-gym[dev] @ ../../\n",
}
# A server of the user's own, not in the package: its directory, as a FROM recipe copies it into the image.
OWN = "resources_servers/my_tools"
OWN_FILES = {
    f"{OWN}/requirements.txt": "-e nemo-gym[dev] @ ../../\nsympy==1.14.0  # the checker's\n",
    f"{OWN}/configs/my_tools.yaml": (
        "my_tools:\n  resources_servers:\n    my_tools:\n      entrypoint: app.py\n"
        "my_tools_agent:\n  responses_api_agents:\n    simple_agent:\n      entrypoint: app.py\n"
    ),
}


def lay_out(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (by path) under ``root``; return ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.fixture
def image(tmp_path: Path) -> Callable[..., str]:
    """`prepare` as the image's build runs it, into tmp_path: the install root `site-packages/` holding the
    package's servers, the image's environment `venv/` and the prepared environments under `servers/`."""
    lay_out(tmp_path / "site-packages", PACKAGE)
    for name in ("python", "activate"):
        lay_out(tmp_path / "venv" / "bin", {name: ""})

    def prepare(server: str, installed: tuple[str, ...] = ()) -> str:
        root, venv = tmp_path / "site-packages", tmp_path / "venv"
        return servers.prepare(server, root, tmp_path / "servers", venv, lambda p: p in installed)

    return prepare


def test_prepare_gives_each_server_the_images_environment(image, tmp_path: Path):
    assert not servers.prepared(TOOL_SERVER, tmp_path / "servers")
    assert [image(server) for server in (POLICY, SIMPLE_AGENT, TOOL_SERVER)] == ["", "", ""]
    assert servers.prepared(TOOL_SERVER, tmp_path / "servers")
    assert (tmp_path / "servers" / TOOL_SERVER / ".venv").resolve() == tmp_path / "venv"
    assert image(TOOL_SERVER) == ""  # a second run (a FROM recipe over an image that has it) changes nothing


def test_prepare_fails_the_build_on_a_directory_it_cannot_find_or_requirements_not_installed(image, tmp_path: Path):
    site = tmp_path / "site-packages"
    assert image(OWN) == f"{OWN}: no directory {site / OWN} (a server of your own: COPY its directory there first)"
    lay_out(site, OWN_FILES)
    assert image(OWN) == (
        f"{OWN}: its requirements are not installed in {tmp_path / 'venv'}: sympy (install them there first, pinned)"
    )
    assert not servers.prepared(OWN, tmp_path / "servers")
    assert image(OWN, installed=("sympy",)) == "" and servers.prepared(OWN, tmp_path / "servers")
    assert image("my_tools").startswith("my_tools: not <server type>/<server name>")


def test_check_names_the_first_server_of_the_jobs_config_that_the_image_did_not_prepare(image, tmp_path: Path):
    root, work = tmp_path / "site-packages", lay_out(tmp_path / "work", {})
    (work / "env.yaml").write_text(config_yaml(render_config(GYM_JOB, GYM_ENV, gym_endpoints())))
    args = [f"+uv_venv_dir={tmp_path / 'servers'}", "+skip_venv_if_present=true"]
    assert servers.server_dirs(servers.gym_config(args, work, root)) == [POLICY, TOOL_SERVER, SIMPLE_AGENT]
    assert image(POLICY) == image(SIMPLE_AGENT) == ""
    assert servers.check(args, work, root) == (
        f"NeMo Gym server {TOOL_SERVER} is not prepared in this image: rebuild it with "
        f'--build-arg SERVERS="... {TOOL_SERVER}", or build FROM ghcr.io/grpojob/nemo-gym:0.1.0 with '
        f"RUN grpojob-servers prepare {TOOL_SERVER}; a server of your own: COPY its directory to "
        f"{root / TOOL_SERVER} first (grpojob docs: guides/nemo-gym.md)"
    )
    image(TOOL_SERVER)
    assert servers.check(args, work, root) == ""
    assert servers.check(["+skip_venv_if_present=true"], work, root) == ""  # installing at start: nothing to check


def test_check_finds_a_server_of_ones_own_named_on_the_command_line_in_the_working_directory(image, tmp_path: Path):
    work = lay_out(tmp_path / "work", OWN_FILES)
    args = [f"+uv_venv_dir={tmp_path / 'servers'}", f"+config_paths=[{OWN}/configs/my_tools.yaml]"]
    image(SIMPLE_AGENT)
    assert servers.check(args, work, tmp_path / "site-packages").startswith(f"NeMo Gym server {OWN} is not prepared")


def test_check_leaves_a_config_it_cannot_read_to_gym_env_start(tmp_path: Path):
    (tmp_path / "env.yaml").write_text("config_paths: [resources_servers/nowhere/configs/nowhere.yaml]\n")
    assert servers.check([f"+uv_venv_dir={tmp_path}"], tmp_path, None) == ""


def test_a_pod_whose_config_names_an_unprepared_server_stops_before_ray_and_the_job_says_which(tmp_path: Path):
    data = gym_endpoints()
    lay_out(tmp_path / "work", PACKAGE)  # NeMo Gym looks in its working directory first, as here
    for server in (POLICY, SIMPLE_AGENT):
        lay_out(tmp_path / "servers" / server / ".venv" / "bin", {"python": "", "activate": ""})
    config = config_yaml(render_config(GYM_JOB, GYM_ENV, data))
    pod_env = {**data, endpoints.GRPOJOB_POD_ATTEMPT: data[endpoints.GRPOJOB_ATTEMPT]}
    done = run_launch_script(tmp_path, pod_env, data, config)
    assert done.returncode == 1 and done.stdout == ""  # neither `ray start` nor `gym env start` ran
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"NeMo Gym server {TOOL_SERVER} is not prepared in this image: rebuild it with ")

    # The kubelet keeps the end of the crashed container's log as its termination message (FallbackToLogsOnError).
    crashed = {"exitCode": 1, "reason": "Error", "message": done.stdout + done.stderr}
    pod = {
        "metadata": {
            "name": "demo-env-tools-5d8f",
            "labels": {"grpo.dev/job": "demo", "grpo.dev/component": "environment", "grpo.dev/environment": "tools"},
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "nemo-gym",
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": crashed},
                }
            ],
        },
    }
    kids = with_gym_running(children(), "10.0.0.2")
    kids["Deployment"]["demo-env-tools"] = DeploymentInfo(
        "demo-env-tools", 0, kids["Deployment"]["demo-env-tools"].nemo_gym_config_hash
    )
    kids["Pod"]["demo-env-tools-5d8f"] = summarize("Pod", pod)
    ready = condition(plan(kids, {"attempt": 1}).status, ConditionType.ENVIRONMENTS_READY)
    assert ready is not None and (ready.status, ready.reason) == ("False", "EnvironmentFailing")
    assert ready.message == (
        f"tools: pod demo-env-tools-5d8f container nemo-gym stopped (exit code 1, Error): {line} (ready: tools 0/1)"
    )


def run_image_entrypoint(tmp_path: Path, *cmd: str) -> subprocess.CompletedProcess:
    """The NeMo Gym image's ENTRYPOINT as its Dockerfile writes it, with ``cmd`` after it, in `tmp_path/work`:
    the image's supervisor and `grpojob-servers`, `gym` standing in as a program that prints its arguments,
    and the prepared environments under `tmp_path/servers`."""
    dockerfile = (SERVERS_SCRIPT.parent / "Dockerfile").read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (.+)$", dockerfile, re.MULTILINE).group(1))
    entrypoint = [arg.replace("/opt/nemo-gym/servers", str(tmp_path / "servers")) for arg in entrypoint]
    programs = {
        "grpojob-supervise": f'exec {sys.executable} {SERVERS_SCRIPT.parent / "supervise.py"} "$@"',
        "grpojob-servers": f'exec {sys.executable} {SERVERS_SCRIPT} "$@"',
        "gym": 'echo gym "$@"',
    }
    bin_dir = lay_out(tmp_path / "bin", {name: f"#!/bin/sh\n{body}\n" for name, body in programs.items()})
    for program in programs:
        (bin_dir / program).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    work = tmp_path / "work"
    return subprocess.run([*entrypoint, *cmd], cwd=work, env=env, capture_output=True, text=True, timeout=60)


def test_the_images_entrypoint_checks_the_servers_before_it_starts_them(tmp_path: Path):
    lay_out(tmp_path / "work", PACKAGE | OWN_FILES)
    for server in (POLICY, SIMPLE_AGENT, TOOL_SERVER):
        lay_out(tmp_path / "servers" / server / ".venv" / "bin", {"python": "", "activate": ""})
    example = f"+config_paths=[{TOOL_CALL},{POLICY}/configs/vllm_model_for_training.yaml]"
    started = run_image_entrypoint(tmp_path, example, "+policy_model_name=tiny")
    assert started.returncode == 0 and started.stderr == ""
    assert started.stdout.split() == [
        "gym",
        "env",
        "start",
        f"+uv_venv_dir={tmp_path / 'servers'}",
        "+skip_venv_if_present=true",
        example,
        "+policy_model_name=tiny",
    ]
    refused = run_image_entrypoint(tmp_path, f"+config_paths=[{OWN}/configs/my_tools.yaml]")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith(f"NeMo Gym server {OWN} is not prepared in this image: rebuild it with ")
