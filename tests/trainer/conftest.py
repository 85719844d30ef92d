"""Real servers for the trainer tests: a tiny random model behind the generation server, and the example
environment servers calling it, each in-process on a free loopback port (uvicorn on a thread)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TEMPERATURE = 1.0
TOP_P = 1.0
MAX_NEW_TOKENS = 16


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random model directory (seed 0)."""
    from grpojob_trainer.models.tiny import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def generation_server(tiny_model_dir: Path) -> Iterator:
    """The OpenAI-compatible server for the tiny model, sampling at TEMPERATURE/TOP_P."""
    from grpojob_trainer.generation.app import ServerConfig
    from grpojob_trainer.generation.backend import SamplingParams
    from grpojob_trainer.generation.server import GenerationServer
    from grpojob_trainer.generation.transformers_backend import TransformersBackend

    backend = TransformersBackend(tiny_model_dir, max_model_len=1024, device="cpu")
    config = ServerConfig("tiny-policy", SamplingParams(TEMPERATURE, TOP_P, MAX_NEW_TOKENS))
    with GenerationServer(backend, config) as server:
        yield server


def start_environment(name: str, policy_base_url: str, **config):
    """An environment server (agent + resources, the agent calling its own resources routes in process) on a
    free port, calling the policy at ``policy_base_url`` (``config``: more `AgentConfig` fields)."""
    from grpojob_trainer.environments import get_environment
    from grpojob_trainer.environments.app import AgentConfig, create_environment_app
    from grpojob_trainer.net.http import ThreadedServer

    config = AgentConfig(policy_base_url=policy_base_url, **config)
    return ThreadedServer(create_environment_app(get_environment(name), config)).start()


@pytest.fixture(scope="session")
def environment_urls(generation_server) -> Iterator[dict[str, str]]:
    """Base URLs of the `arithmetic` and `lookup` environment servers."""
    servers = {name: start_environment(name, generation_server.base_url) for name in ("arithmetic", "lookup")}
    yield {name: server.url for name, server in servers.items()}
    for server in servers.values():
        server.stop()


@pytest.fixture(scope="session")
def policy_sampling():
    """The server's sampling parameters, as the rollout collector writes them into rows."""
    from grpojob_trainer.experience.rollouts import PolicySampling

    return PolicySampling(TEMPERATURE, TOP_P, MAX_NEW_TOKENS)
