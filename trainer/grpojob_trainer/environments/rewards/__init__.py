"""Reward functions as users write them, served as a NeMo Gym resources server (and agent): the file's functions
and the built-in verifiers (math, format, code), weighted and summed.

``GRPOJOB_REWARDS='{"file": "rewards.py", "functions": [{"name": "exact"}, {"builtin": "format", "weight": 0.5}]}'
python -m grpojob_trainer.environments rewards``
"""

from __future__ import annotations

from grpojob_trainer.environments.rewards.config import RewardsConfig, RewardsConfigError
from grpojob_trainer.environments.rewards.environment import RewardsEnvironment
from grpojob_trainer.environments.rewards.functions import FunctionFailed, RewardFileError

__all__ = ["FunctionFailed", "RewardFileError", "RewardsConfig", "RewardsConfigError", "RewardsEnvironment"]
