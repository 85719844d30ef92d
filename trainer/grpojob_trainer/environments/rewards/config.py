"""The reward server's configuration: which file, which functions with which weights, and the limits they run
under. It arrives as JSON in ``GRPOJOB_REWARDS``, written by the operator (or `grpojob run`) from the job's
``spec.environments[].rewards``, with the file's path as the server's process sees it."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from grpojob_api.v1alpha1 import ApiModel

CONFIG_ENV = "GRPOJOB_REWARDS"
"""The environment variable holding the configuration as JSON."""
BUILTINS = ("math", "format", "code")


class RewardFunction(ApiModel):
    """One reward function: a function of the reward file (`name`) or a built-in verifier (`builtin`), and its
    weight in the sum."""

    name: str | None = Field(default=None, min_length=1, max_length=253, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """The function's name in the reward file."""
    builtin: Literal["math", "format", "code"] | None = None
    """A built-in verifier: `math` (the final answer equals the row's `expected_answer` by value), `format`
    (`<think>…</think><answer>…</answer>`) or `code` (the completion's code passes the row's `tests`)."""
    weight: float = Field(default=1.0, ge=-1_000_000, le=1_000_000)
    """The function's weight: the reward is the weighted sum of the functions that apply to a row."""

    @model_validator(mode="after")
    def _one_kind(self) -> RewardFunction:
        if (self.name is None) == (self.builtin is None):
            raise ValueError("set exactly one of name (a function of the reward file) or builtin (math, format, code)")
        return self

    @property
    def label(self) -> str:
        """The name the function's reward is reported under: its own, or the built-in's."""
        return self.name or str(self.builtin)


class CodeSandbox(ApiModel):
    """The limits of each program the `code` verifier runs (the completion's code and the row's tests)."""

    cpu_seconds: int = Field(default=10, ge=1, le=600)
    """CPU time of the program; past it the program is killed and fails."""
    memory_mb: int = Field(default=512, ge=64, le=65536)
    """Address space of the program in MiB; an allocation past it fails."""


class RewardsConfig(ApiModel):
    """What the reward server serves."""

    file: str | None = Field(default=None, min_length=1)
    """The Python file defining the named functions, as a path this process can open (none: built-ins only)."""
    functions: list[RewardFunction] = Field(min_length=1, max_length=32)
    """The functions, summed with their weights."""
    timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    """How long one function may take on one rollout; past it the rollout fails, naming the function."""
    workers: int = Field(default=2, ge=1, le=256)
    """Processes running the functions side by side (each imports the file once)."""
    sandbox: CodeSandbox = Field(default_factory=CodeSandbox)
    """Limits of the `code` verifier's programs."""

    @model_validator(mode="after")
    def _consistent(self) -> RewardsConfig:
        labels = [function.label for function in self.functions]
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        if repeated:
            raise ValueError(f"functions: {', '.join(repeated)} named more than once")
        if self.file is None and any(function.name is not None for function in self.functions):
            raise ValueError("functions name functions of a reward file, but no file is given")
        return self


class RewardsConfigError(ValueError):
    """``GRPOJOB_REWARDS`` is missing or does not describe a reward server."""


def config_from_env(environ: os._Environ[str] | dict[str, str] = os.environ) -> RewardsConfig:
    """The configuration in ``GRPOJOB_REWARDS``; raises `RewardsConfigError` naming what is wrong."""
    from grpojob_trainer.nemo_gym.protocol import describe

    text = environ.get(CONFIG_ENV)
    if not text:
        raise RewardsConfigError(f"{CONFIG_ENV} is not set: it holds the reward functions as JSON")
    try:
        return RewardsConfig.model_validate_json(text)
    except ValidationError as error:
        raise RewardsConfigError(f"{CONFIG_ENV}: {describe(error)}") from None
