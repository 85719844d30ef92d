"""A row whose prompt does not fit the generation server's context: recognised, measured and explained.

Our generation server refuses a prompt of ``max_model_len`` tokens or more (HTTP 400, "This model's
maximum context length is ..."). NeMo Gym's ``vllm_model`` turns a 400 that mentions the context length
into an empty completion cut for length, so ``/run`` answers 200 with reward 0, no token ids and
``incomplete_details.reason: max_output_tokens``: nothing in it says how long the prompt was.
`overflowed_context` recognises that answer; `measure_prompt` asks the generation server's ``/tokenize``
for the prompt's length and the context (the row's messages and tools under the same chat template the
refused request had); `prompt_too_long` says both and what to change.

Such a row is skipped: not trained on, not retried, counted as a failed rollout and in
``rollout/prompt_too_long``; the step trains on the rest, as NeMo-RL leaves prompts longer than its
sequence length out of the loss. A step whose rollouts all fail counts toward ``grpo.maxFailedSteps``,
so a dataset whose prompts are all too long ends the job with this message.
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp

from grpojob_trainer.nemo_gym.protocol import Row, RunResult
from grpojob_trainer.nemo_gym.responses import chat_tools, input_items, responses_to_chat

LENGTH_REASON = "max_output_tokens"
"""``incomplete_details.reason`` of a Responses object whose model call stopped for length."""
MEASURE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class PromptLength:
    """A row's prompt as the generation server tokenizes it, and the server's context."""

    tokens: int
    max_model_len: int


def overflowed_context(result: RunResult) -> bool:
    """Whether ``result`` is NeMo Gym's answer to a refused prompt: the episode stopped for length and no
    model call generated a token (a call that ran out of tokens after generating carries its token ids)."""
    response = result.response
    reason = (response.incomplete_details or {}).get("reason")
    return reason == LENGTH_REASON and not any(item.get("generation_token_ids") for item in response.output)


async def measure_prompt(client: aiohttp.ClientSession, generation_url: str, row: Row) -> PromptLength | None:
    """The length of ``row``'s prompt by the generation server at ``generation_url`` (its root or its
    ``/v1`` base URL) and the server's context; None when the server cannot tell (the message then says
    less, and nothing else changes)."""
    params = row.responses_create_params
    url = generation_url.rstrip("/").removesuffix("/v1") + "/tokenize"
    try:
        body = {
            "messages": responses_to_chat(input_items(params.input), params.instructions),
            "tools": chat_tools(params.tools),
        }
        async with client.post(url, json=body, timeout=aiohttp.ClientTimeout(total=MEASURE_TIMEOUT_S)) as answer:
            if answer.status != 200:
                return None
            counted = await answer.json()
        return PromptLength(int(counted["count"]), int(counted["max_model_len"]))
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
        return None


def prompt_too_long(length: PromptLength | None) -> str:
    """The rollout error of a prompt that did not fit the context: its length, ``maxModelLen``, and what to
    change."""
    if length is None:
        measured = "the prompt is longer than the generation server's context (spec.generation.maxModelLen)"
    else:
        measured = (
            f"the prompt is {length.tokens} tokens and spec.generation.maxModelLen is {length.max_model_len}, "
            "which must also leave room for the answer"
        )
    return (
        f"prompt too long: {measured}; NeMo Gym's model server answered an empty completion for it. Raise "
        "spec.generation.maxModelLen (up to the model's context) or leave such rows out of the dataset; "
        "the row is skipped (rollout/prompt_too_long)"
    )
