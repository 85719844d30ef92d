"""Multi-turn tool use: the model looks a key up with the ``lookup`` tool, then answers with the value.

Each rollout spans several model calls (call the tool → read its output → answer), so every later
call reuses the earlier turns' exact token ids. A model that answers without calling the tool is
nudged with a user message (up to ``max_model_calls`` model calls), even after a truncated turn, so
even a random model produces multi-turn rollouts.
The resources server remembers, per session (cookie), which keys were looked up.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from grpojob_trainer.environments.base import AnswerTask, ExampleEnvironment, Tool, Verdict, final_answer
from grpojob_trainer.nemo_gym.protocol import make_row

KEYS = ("apple", "river", "stone", "cloud", "tiger", "piano", "lemon", "rocket", "garden", "silver")
TOOL_WEIGHT = 0.2
CONTAINS_WEIGHT = 0.3
EXACT_WEIGHT = 0.5


def value_of(key: str) -> str:
    """The hidden two-digit value of ``key`` (stable across processes)."""
    return str(10 + int(hashlib.sha256(key.encode()).hexdigest(), 16) % 90)


async def lookup(arguments: dict[str, Any], session: dict[str, Any]) -> dict[str, Any]:
    """The ``lookup`` tool: ``{"key": str}`` → ``{"value": str}`` (or an error)."""
    key = arguments.get("key")
    if not isinstance(key, str):
        return {"error": "lookup needs a string argument 'key'"}
    session.setdefault("looked_up", []).append(key)
    if key not in KEYS:
        return {"error": f"unknown key {key!r}"}
    return {"value": value_of(key)}


class LookupTask(AnswerTask):
    """The key to look up and its value (the expected answer)."""

    key: str


class LookupEnvironment(ExampleEnvironment):
    """Find a key's value with the tool and answer with the value only."""

    name = "lookup"
    task = LookupTask
    max_model_calls = 3

    def tools(self) -> list[Tool]:
        """The one tool, ``lookup``."""
        parameters = {
            "type": "object",
            "properties": {"key": {"type": "string", "description": "the key to look up"}},
            "required": ["key"],
            "additionalProperties": False,
        }
        return [Tool("lookup", "Look up the value of a key.", parameters, lookup)]

    def make_row(self, rng: random.Random) -> dict[str, Any]:
        """A row asking for the value of a random key."""
        key = rng.choice(KEYS)
        text = f"Use the lookup tool to find the value of {key}, then reply with the value only."
        tools = [tool.declaration() for tool in self.tools()]
        return make_row(self.name, text, tools=tools, key=key, expected_answer=value_of(key))

    def follow_up(self, outputs: list[dict[str, Any]], model_calls: int, truncated: bool) -> str | None:
        """Nudge a model that answered (or ran out of tokens) before calling the tool."""
        if any(item.get("type") == "function_call" for item in outputs):
            return None
        example = json.dumps({"name": "lookup", "arguments": {"key": "KEY"}})
        return f"Call the lookup tool first: <tool_call>{example}</tool_call>"

    def verify(self, row: dict[str, Any], response: dict[str, Any], session: dict[str, Any]) -> Verdict:
        """0.2 for looking the right key up (from the session), 0.3 for the value in the answer, 0.5 exact."""
        expected = str(row["expected_answer"])
        answer = final_answer(response).strip()
        return Verdict(
            {
                "tool": TOOL_WEIGHT * (row.get("key") in session.get("looked_up", [])),
                "contains": CONTAINS_WEIGHT * (expected in answer),
                "exact": EXACT_WEIGHT * (answer == expected),
            }
        )
