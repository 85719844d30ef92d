"""Example NeMo Gym-compatible environments and the server that hosts one.

``python -m grpojob_trainer.environments NAME --port P [--policy-base-url URL]`` serves one;
``python -m grpojob_trainer.environments.dataset NAME --rows N --out FILE`` writes its rows.
"""

from __future__ import annotations

from grpojob_trainer.environments.arithmetic import ArithmeticEnvironment
from grpojob_trainer.environments.base import Environment, ExampleEnvironment
from grpojob_trainer.environments.lookup import LookupEnvironment

ENVIRONMENTS: dict[str, type[ExampleEnvironment]] = {
    ArithmeticEnvironment.name: ArithmeticEnvironment,
    LookupEnvironment.name: LookupEnvironment,
}


def get_environment(name: str) -> ExampleEnvironment:
    """The example environment called ``name``."""
    try:
        return ENVIRONMENTS[name]()
    except KeyError:
        raise KeyError(f"unknown environment {name!r}; known: {sorted(ENVIRONMENTS)}") from None


__all__ = ["ENVIRONMENTS", "Environment", "ExampleEnvironment", "get_environment"]
