"""What an environment defines: its tools, scoring and (optionally) follow-ups; and an example environment's rows."""

from __future__ import annotations

import abc
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from grpojob_trainer.nemo_gym.responses import item_text

ToolHandler = Callable[[dict[str, Any], dict[str, Any]], Awaitable[Any]]
"""``handler(arguments, session_state) -> JSON-serialisable result``."""


@dataclass(frozen=True)
class Tool:
    """A function tool: its Responses-API declaration and the coroutine that runs it."""

    name: str
    description: str
    parameters: dict[str, Any]
    handler: ToolHandler

    def declaration(self) -> dict[str, Any]:
        """The tool as a row's ``responses_create_params.tools`` entry."""
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "strict": True,
        }


@dataclass(frozen=True)
class Verdict:
    """A reward and its components (``reward`` is their sum, as NeMo-RL checks)."""

    components: dict[str, float]
    details: dict[str, Any] = field(default_factory=dict)
    """More fields of ``/verify``'s answer."""

    @property
    def reward(self) -> float:
        return float(sum(self.components.values()))


class VerificationFailed(Exception):
    """A rollout that cannot be scored (``/verify`` answers 422 with the message): it counts as failed, not as
    a reward of 0."""


class Task(BaseModel):
    """The task fields of a row that an environment's `verify` reads; ``/run`` and ``/verify`` refuse a row
    without them (422, naming the field). Other fields pass through."""

    model_config = ConfigDict(extra="allow")


class AnswerTask(Task):
    """A task with an expected answer."""

    expected_answer: str = Field(coerce_numbers_to_str=True)
    """What earns the full reward (a JSON number reads as its digits)."""


class Environment(abc.ABC):
    """What an environment server serves: the episode rules its agent follows (tools, model calls, follow-ups)
    and how a finished episode is scored."""

    name: str
    """The environment name: ``agent_ref.name`` of its rows and the default instance name."""
    task: type[Task] = Task
    """The task fields its rows must carry."""
    max_model_calls: int = 4
    """Hard cap on model calls per episode, so no episode loops forever."""

    def tools(self) -> list[Tool]:
        """Tools the model may call (none by default)."""
        return []

    @abc.abstractmethod
    async def score(self, row: dict[str, Any], response: dict[str, Any], session: dict[str, Any]) -> Verdict:
        """Score a finished episode, awaited by ``/verify`` (``response`` is the Responses object with every
        output item). Raises `VerificationFailed` when the rollout cannot be scored."""

    def stop(self) -> None:  # noqa: B027 - a hook with nothing to do by default
        """Release what the environment holds when its server stops (nothing by default)."""

    def follow_up(self, outputs: list[dict[str, Any]], model_calls: int, truncated: bool) -> str | None:
        """A user message to continue an episode whose last turn had no tool call (None: stop, as Gym's
        simple agent does). ``truncated``: that turn hit the token limit."""
        return None


class ExampleEnvironment(Environment):
    """An environment that ships with grpojob (``arithmetic``, ``lookup``): it makes its own rows and scores
    an episode in the server's process."""

    @abc.abstractmethod
    def make_row(self, rng: random.Random) -> dict[str, Any]:
        """One dataset row in NeMo Gym's format (``agent_ref.name`` = `name`)."""

    @abc.abstractmethod
    def verify(self, row: dict[str, Any], response: dict[str, Any], session: dict[str, Any]) -> Verdict:
        """Score a finished episode."""

    async def score(self, row: dict[str, Any], response: dict[str, Any], session: dict[str, Any]) -> Verdict:
        return self.verify(row, response, session)

    def make_rows(self, count: int, seed: int = 0) -> list[dict[str, Any]]:
        """``count`` rows, reproducible from ``seed``."""
        rng = random.Random(seed)
        return [self.make_row(rng) for _ in range(count)]


def final_answer(response: dict[str, Any]) -> str:
    """Text of the last assistant message of an episode ("" when there is none)."""
    for item in reversed(response.get("output", [])):
        if item.get("type") == "message" and item.get("role") == "assistant":
            return item_text(item.get("content"))
    return ""
