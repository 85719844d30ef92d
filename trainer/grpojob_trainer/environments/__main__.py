"""Serve one environment (agent + resources routes): the environment image's entrypoint.

``python -m grpojob_trainer.environments NAME --port P [--policy-base-url URL]``; ``PORT``,
``POLICY_BASE_URL`` and ``POLICY_MODEL_NAME`` are read from the environment when the flags are absent.
``NAME`` is an example environment, or ``rewards``: the reward functions that ``GRPOJOB_REWARDS`` names
(`grpojob_trainer.environments.rewards`). A reward file that does not import stops the server before it
listens, its error the last line of the log.
"""

from __future__ import annotations

import argparse
import os

import uvicorn

from grpojob_api import endpoints
from grpojob_api.endpoints import ContractError
from grpojob_trainer.cluster.rendezvous import current_endpoints
from grpojob_trainer.environments import ENVIRONMENTS, get_environment
from grpojob_trainer.environments.app import AgentConfig, create_environment_app
from grpojob_trainer.environments.base import Environment


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags, defaulting to the environment variables named in their help."""
    env = os.environ.get
    parser = argparse.ArgumentParser(description="Serve a NeMo Gym environment")
    parser.add_argument("name", choices=[*sorted(ENVIRONMENTS), REWARDS], help="environment to serve")
    parser.add_argument("--host", default=env(endpoints.HOST, "0.0.0.0"), help=f"({endpoints.HOST})")
    parser.add_argument("--port", type=int, default=int(env(endpoints.PORT, "8080")), help=f"({endpoints.PORT})")
    parser.add_argument(
        "--policy-base-url", default=env(endpoints.POLICY_BASE_URL), help=f"…/v1 URL ({endpoints.POLICY_BASE_URL})"
    )
    parser.add_argument(
        "--policy-model-name", default=env(endpoints.POLICY_MODEL_NAME), help=f"({endpoints.POLICY_MODEL_NAME})"
    )
    parser.add_argument(
        "--resources-url",
        default=env(endpoints.RESOURCES_URL),
        help=f"resources server (default: this server) ({endpoints.RESOURCES_URL})",
    )
    args = parser.parse_args(argv)
    if not args.policy_base_url:
        parser.error(f"--policy-base-url (or {endpoints.POLICY_BASE_URL}) is required")
    return args


REWARDS = "rewards"


def load_environment(name: str) -> Environment:
    """The environment ``name``, started: the reward functions' workers have imported the reward file."""
    if name != REWARDS:
        return get_environment(name)
    from grpojob_trainer.environments.rewards import RewardFileError, RewardsConfigError, RewardsEnvironment
    from grpojob_trainer.environments.rewards.config import config_from_env

    try:
        environment = RewardsEnvironment(config_from_env())
        environment.start()
    except (RewardsConfigError, RewardFileError) as error:
        raise SystemExit(f"environment rewards: {error}") from None
    return environment


def main(argv: list[str] | None = None) -> None:
    """Serve until interrupted."""
    args = parse_args(argv)
    from_endpoints = args.policy_base_url == os.environ.get(endpoints.POLICY_BASE_URL)
    if endpoints.GRPOJOB_POD_ATTEMPT in os.environ and from_endpoints:
        # A pod of a job, addressed by its endpoints: never an older attempt's (re-read until they are current).
        try:
            args.policy_base_url = current_endpoints(os.environ).policy_base_url
        except ContractError as error:
            raise SystemExit(f"environment {args.name}: {error}") from None
    config = AgentConfig(
        policy_base_url=args.policy_base_url,
        resources_url=args.resources_url or None,
        policy_model_name=args.policy_model_name,
    )
    app = create_environment_app(load_environment(args.name), config)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
