"""The reward-function environment: single-turn rollouts scored by the configured functions' weighted sum.

``/verify`` answers the row echoed back with ``reward`` (the weighted sum of the functions that apply),
``reward_components`` (each applying function's weighted reward: they sum to ``reward``, as NeMo-RL checks)
and ``reward_functions`` (each function's own reward, null where it does not apply). A function that fails
fails the rollout (`VerificationFailed`, HTTP 422 naming the function, the row and the error): a reward of 0
would teach the policy something false.
"""

from __future__ import annotations

from typing import Any

from grpojob_trainer.environments.base import Environment, Verdict, VerificationFailed
from grpojob_trainer.environments.rewards.config import RewardsConfig
from grpojob_trainer.environments.rewards.functions import FunctionFailed, RewardFileError
from grpojob_trainer.environments.rewards.workers import WorkerPool
from grpojob_trainer.nemo_gym.protocol import TOKEN_FIELDS, content_text
from grpojob_trainer.nemo_gym.responses import input_items, responses_to_chat

NOT_COLUMNS = ("responses_create_params", "agent_ref", "response")
"""Fields of a ``/verify`` body that are not the row's columns."""
ROW_PREVIEW_CHARS = 60


def prompt_of(params: dict[str, Any]) -> str | list[dict[str, Any]]:
    """The row's prompt as TRL passes it: a string, or messages (``role`` and text ``content``)."""
    value = params["input"]
    if isinstance(value, str):
        return value
    return [
        {"role": item.get("role", "user"), "content": content_text(item.get("content")) or ""}
        for item in input_items(value)
        if item.get("type", "message") == "message"
    ]


def completion_of(response: dict[str, Any], conversational: bool) -> str | list[dict[str, Any]]:
    """The episode as TRL's completion: the assistant's text (reasoning as ``<think>…</think>`` in front), or for
    a conversational prompt the messages the episode added."""
    messages = [  # an empty answer is "", as TRL hands it over
        {key: value for key, value in message.items() if key not in TOKEN_FIELDS}
        | {"content": message["content"] or ""}
        for message in responses_to_chat(response.get("output", []))
    ]
    if conversational:
        return messages
    return "".join(m.get("content") or "" for m in messages if m.get("role") == "assistant")


def completion_ids_of(response: dict[str, Any]) -> list[int]:
    """Every token the policy generated in the episode."""
    return [token for item in response.get("output", []) for token in item.get("generation_token_ids") or []]


def describe_row(row: dict[str, Any], prompt: str | list[dict[str, Any]]) -> str:
    """The row in an error message: its index in the dataset when NeMo Gym numbered it, and its prompt's start."""
    users = [m["content"] for m in prompt if m["role"] == "user"] if not isinstance(prompt, str) else [prompt]
    text = users[-1] if users else ""
    text = " ".join(text.split())
    preview = text if len(text) <= ROW_PREVIEW_CHARS else text[: ROW_PREVIEW_CHARS - 1] + "…"
    index = row.get("_ng_task_index")
    return (f"row {index} " if index is not None else "the row ") + repr(preview)


class RewardsEnvironment(Environment):
    """Score each rollout with the reward functions of `RewardsConfig`, run by a `WorkerPool`; its rows are the
    job's dataset."""

    name = "rewards"
    max_model_calls = 1

    def __init__(self, config: RewardsConfig) -> None:
        self.config = config
        self.workers = WorkerPool(config)

    def start(self) -> None:
        """Start the workers; raises `RewardFileError` when the reward file does not import."""
        self.workers.start()

    def stop(self) -> None:
        self.workers.stop()

    async def score(self, row: dict[str, Any], response: dict[str, Any], session: dict[str, Any]) -> Verdict:
        prompt = prompt_of(row["responses_create_params"])
        arguments: dict[str, list[Any]] = {
            "prompts": [prompt],
            "completions": [completion_of(response, conversational=not isinstance(prompt, str))],
            "completion_ids": [completion_ids_of(response)],
        }
        arguments.update({key: [value] for key, value in row.items() if key not in NOT_COLUMNS})
        where = describe_row(row, prompt)
        values: dict[str, float | None] = {}
        for index, function in enumerate(self.config.functions):
            try:
                (values[function.label],) = await self.workers.call(index, arguments, where)
            except (FunctionFailed, RewardFileError) as error:
                raise VerificationFailed(str(error)) from None
        weights = {function.label: function.weight for function in self.config.functions}
        components = {label: weights[label] * value for label, value in values.items() if value is not None}
        if not components:
            raise VerificationFailed(f"no reward function applies to {where}: each returned None ({', '.join(values)})")
        return Verdict(components, details={"reward_functions": values})
