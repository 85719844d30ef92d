"""The contract with a reward server's pods (and its processes under `grpojob run`): the configuration it reads
from `GRPOJOB_REWARDS`, rendered from `spec.environments[].rewards` with the reward file's path as the server
sees it, and where the operator mounts the file."""

from __future__ import annotations

from pydantic import Field, model_validator

from grpojob_api import v1alpha1 as api

CONFIG_ENV = "GRPOJOB_REWARDS"
"""The environment variable holding `RewardsServerConfig` as JSON."""
MOUNT_DIR = "/etc/grpojob-rewards"
"""Where an environment's pods find its reward file: `<MOUNT_DIR>/<key>` of a ConfigMap, or `path` inside the
claim mounted at `<MOUNT_DIR>/claim`."""
CLAIM_MOUNT = f"{MOUNT_DIR}/claim"
SERVER_COMMAND = ("python", "-m", "grpojob_trainer.environments", "rewards")
"""What the pods (and `grpojob run`) run: the environment image's reward server."""


class RewardsServerConfig(api.ApiModel):
    """What one reward server serves: the spec's functions and limits, and the file as a path it can open."""

    file: str | None = Field(default=None, min_length=1)
    """The Python file defining the named functions (none: built-ins only)."""
    functions: list[api.RewardFunction] = Field(min_length=1, max_length=32)
    timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    workers: int = Field(default=2, ge=1, le=64)
    sandbox: api.CodeSandbox = Field(default_factory=api.CodeSandbox)

    @model_validator(mode="after")
    def _consistent(self) -> RewardsServerConfig:
        labels = [function.label for function in self.functions]
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        if repeated:
            raise ValueError(f"functions: {', '.join(repeated)} named more than once")
        if self.file is None and any(function.name is not None for function in self.functions):
            raise ValueError("functions name functions of a reward file, but no file is given")
        return self


def pod_file(rewards: api.RewardsSpec) -> str | None:
    """The reward file as the environment's pods see it: the ConfigMap's key under `MOUNT_DIR`, `path` in the
    claim mounted at `CLAIM_MOUNT`, else `path` in the image (None: built-ins only)."""
    if rewards.config_map is not None:
        return f"{MOUNT_DIR}/{rewards.config_map_key}"
    if rewards.pvc is not None:
        return f"{CLAIM_MOUNT}/{str(rewards.path).lstrip('/')}"
    return rewards.path


def server_config(rewards: api.RewardsSpec, file: str | None) -> RewardsServerConfig:
    """The server's configuration, the reward file at ``file``."""
    return RewardsServerConfig(
        file=file,
        functions=rewards.functions,
        timeout_seconds=rewards.timeout_seconds,
        workers=rewards.workers,
        sandbox=rewards.sandbox,
    )


def server_env(rewards: api.RewardsSpec, file: str | None) -> dict[str, str]:
    """The server's environment variable: `GRPOJOB_REWARDS` = the configuration as JSON."""
    return {CONFIG_ENV: server_config(rewards, file).model_dump_json(by_alias=True, exclude_none=True)}
