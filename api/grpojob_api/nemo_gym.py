"""NeMo Gym's config for a `nemoGym` environment, rendered one way for the cluster and for `grpojob run`.

NeMo Gym (`gym env start`, formerly `ng_run`) reads an `env.yaml` in its working directory over its config
files; the rendered config is that file. The operator writes it into `<job>-env-<env>-nemo-gym` for the
environment's pods (`grpojob_operator.children.nemo_gym`); `grpojob run` writes it for the NeMo Gym image it
starts under podman (`grpojob_trainer.local.nemo_gym_containers`). Both run the same image, so the servers,
their versions and the config are the same on a laptop and on the cluster; only the addresses differ
(`NemoGymPlacement`).

Pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml

from grpojob_api import v1alpha1 as api

DEFAULT_IMAGE = "ghcr.io/grpojob/nemo-gym:0.1.0"
"""The NeMo Gym image of an environment that names none: the operator's default `nemoGymImage`, and
`grpojob run`'s."""
CONFIG_DIR = "/etc/nemo-gym"
"""Where the image's launch command finds the rendered config (a ConfigMap in a pod, a bind mount locally)."""
CONFIG_FILE = "env.yaml"
"""The name NeMo Gym looks for in its working directory."""
WORK_DIR = "/tmp"
"""HOME and the working directory (NeMo Gym's cache/ and results/, Hydra's outputs/, /tmp/ray): writable."""
IMAGE_SERVERS_DIR = "/opt/nemo-gym/servers"
"""The NeMo Gym image's prepared virtual environments (images/nemo-gym/servers.py)."""
GYM_ARGS = f"+uv_venv_dir={IMAGE_SERVERS_DIR} +skip_venv_if_present=true"
"""`gym env start`'s arguments in the image: the prepared environments, so nothing installs at start."""
HEAD_SERVER_PORT = 11000
"""NeMo Gym's default head server port; fixed in a pod so that it never takes the agent's port."""
POLICY_API_KEY = "none"
"""NeMo Gym's vllm_model sends `Authorization: Bearer <policy_api_key>`; the generation server asks for none."""


@dataclass(frozen=True)
class NemoGymPlacement:
    """Where one environment's NeMo Gym servers run and what they reach: the only part of the config that
    differs between a pod and `grpojob run`."""

    policy_base_url: str
    """The generation server(s), OpenAI-compatible (`.../v1`)."""
    ray_head_node_address: str | None
    """The job's Ray GCS to join; None lets NeMo Gym start a Ray head of its own (`grpojob run`)."""
    agent_host: str
    """Where the agent listens for the trainer's `/run` calls."""
    agent_port: int
    head_server_port: int = HEAD_SERVER_PORT


URL = TypeVar("URL")


def with_agent_names(environments: list[api.EnvironmentSpec], urls: Mapping[str, URL]) -> dict[str, URL]:
    """Environment URLs by environment name, and each NeMo Gym environment's also under its agent's name
    (NeMo Gym's dataset rows carry it in `agent_ref.name`) unless an environment has that name."""
    routed = dict(urls)
    for env in environments:
        if env.nemo_gym is not None and env.name in urls:
            routed.setdefault(env.nemo_gym.agent, urls[env.name])
    return routed


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in: nested mappings merge key by key, anything else is replaced."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def render_config(job: api.GRPOJob, env: api.EnvironmentSpec, placement: NemoGymPlacement) -> dict[str, Any]:
    """NeMo Gym's config for environment ``env`` of ``job``, placed by ``placement``.

    The user's overrides come first; what the job sets wins over them: the config files (the policy model
    server's first), the generation server as the policy, the Ray cluster (when there is one to join), the
    head server's port and the agent's host and port. The other servers listen on loopback, on ports NeMo
    Gym picks.
    """
    gym = env.nemo_gym
    if gym is None:
        raise ValueError(f"environment {env.name} is not a NeMo Gym environment")
    config_paths = list(dict.fromkeys([gym.policy_model_config_path, *gym.config_paths]))
    owned: dict[str, Any] = {
        "config_paths": config_paths,
        "policy_base_url": placement.policy_base_url,
        "policy_api_key": POLICY_API_KEY,
        "policy_model_name": job.spec.model.served_model_name,
    }
    if placement.ray_head_node_address is not None:
        owned["ray_head_node_address"] = placement.ray_head_node_address
    owned |= {
        "default_host": "127.0.0.1",
        "head_server": {"host": "127.0.0.1", "port": placement.head_server_port},
        gym.agent: {
            "responses_api_agents": {gym.agent_server: {"host": placement.agent_host, "port": placement.agent_port}}
        },
    }
    merged = deep_merge(gym.overrides, owned)
    return {key: merged[key] for key in owned} | merged  # the job's keys first, for whoever reads it


def config_yaml(config: Mapping[str, Any]) -> str:
    """The config as the `env.yaml` NeMo Gym reads."""
    return yaml.safe_dump(dict(config), sort_keys=False)


def launch_script(before_start: str = "") -> str:
    """The shell script the NeMo Gym image runs (under its supervisor, `grpojob-supervise`): copy the config into
    the working directory, stop at once with one line when it names a server the image did not prepare
    (`grpojob-servers check`), run ``before_start``, then `gym env start`."""
    return (
        f"set -eu\ncp {CONFIG_DIR}/{CONFIG_FILE} {CONFIG_FILE}\ngrpojob-servers check {GYM_ARGS}\n"
        f"{before_start}exec gym env start {GYM_ARGS}\n"
    )


def launch_command(before_start: str = "") -> list[str]:
    """The container's command: `launch_script` under the image's supervisor, which stops every server when
    the container is stopped."""
    return ["grpojob-supervise", "/bin/bash", "-c", launch_script(before_start)]
