"""The reward server's configuration (`grpojob_api.rewards.RewardsServerConfig`): which file, which functions with
which weights, and the limits they run under, read from JSON in ``GRPOJOB_REWARDS``."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import ValidationError

from grpojob_api.rewards import CONFIG_ENV
from grpojob_api.rewards import RewardsServerConfig as RewardsConfig
from grpojob_trainer.nemo_gym.protocol import describe


class RewardsConfigError(ValueError):
    """``GRPOJOB_REWARDS`` is missing or does not describe a reward server."""


def config_from_env(environ: Mapping[str, str] = os.environ) -> RewardsConfig:
    """The configuration in ``GRPOJOB_REWARDS``; raises `RewardsConfigError` naming what is wrong."""
    text = environ.get(CONFIG_ENV)
    if not text:
        raise RewardsConfigError(f"{CONFIG_ENV} is not set: it holds the reward functions as JSON")
    try:
        return RewardsConfig.model_validate_json(text)
    except ValidationError as error:
        raise RewardsConfigError(f"{CONFIG_ENV}: {describe(error)}") from None


__all__ = ["CONFIG_ENV", "RewardsConfig", "RewardsConfigError", "config_from_env"]
