"""A ``/run`` result (`RunResult`) → `TrainingSample`, with NeMo-RL's contiguity check."""

from __future__ import annotations

import math
from typing import Any

from grpojob_trainer.algorithm.samples import TrainingSample
from grpojob_trainer.nemo_gym.protocol import RunResult, TokenIds, TokenIdsError


class RolloutConversionError(ValueError):
    """A ``/run`` result that cannot become a training sample (the rollout counts as failed)."""


def token_turns(output: list[dict[str, Any]]) -> list[TokenIds]:
    """The token ids of each model call, from the output items that close one (those with non-empty
    ``generation_token_ids``); raises `RolloutConversionError` when such an item's ids are incomplete
    or malformed."""
    turns: list[TokenIds] = []
    for item in output:
        if not item.get("generation_token_ids"):
            continue
        try:
            tokens = TokenIds.carried_by(item)
        except TokenIdsError as error:
            raise RolloutConversionError(f"model call {len(turns)}: {error}") from None
        if tokens is not None:
            turns.append(tokens)
    return turns


def result_to_sample(result: RunResult, group_index: int) -> TrainingSample:
    """Flatten one rollout into token ids, a generated-token mask and generation log-probs.

    Walks ``response.output`` as NeMo-RL does: for each model call, ``prompt_token_ids`` must start with
    every token seen so far; the new prompt tokens are context (masked out, log-prob 0.0) and the
    generated tokens are trained on. Raises `RolloutConversionError` when there are no token ids, the
    history is not contiguous, or a log-prob is not finite (`RunResult` already holds a finite reward).
    """
    turns = token_turns(result.response.output)
    if not turns:
        raise RolloutConversionError(
            "no output item carries generation_token_ids: the model server must return token ids"
        )
    seen: list[int] = []
    mask: list[bool] = []
    log_probs: list[float] = []
    for number, tokens in enumerate(turns):
        prompt, generated = tokens.prompt_token_ids, tokens.generation_token_ids
        generated_log_probs = tokens.generation_log_probs
        if prompt[: len(seen)] != seen:
            raise RolloutConversionError(
                f"model call {number} is not contiguous: its prompt_token_ids do not start with the "
                f"{len(seen)} tokens of the earlier calls (first difference at {_first_difference(seen, prompt)})"
            )
        if not all(math.isfinite(lp) for lp in generated_log_probs):
            raise RolloutConversionError(f"model call {number}: a generation log-prob is NaN or infinite")
        context = prompt[len(seen) :]
        seen += context + generated
        mask += [False] * len(context) + [True] * len(generated)
        log_probs += [0.0] * len(context) + generated_log_probs
    return TrainingSample(
        token_ids=tuple(seen),
        generated_mask=tuple(mask),
        generation_log_probs=tuple(log_probs),
        reward=result.reward,
        group_index=group_index,
        truncated=result.response.truncated,
        turns=len(turns),
        reward_parts=reward_parts(result),
    )


def reward_parts(result: RunResult) -> tuple[tuple[str, float], ...]:
    """The named parts of a rollout's reward: the reward functions' own rewards (``reward_functions``, None for a
    function that does not apply), else ``reward_components``; only finite numbers."""
    functions = (result.model_extra or {}).get("reward_functions")
    parts = functions if isinstance(functions, dict) else (result.reward_components or {})
    return tuple(
        (str(name), float(value))
        for name, value in parts.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    )


def _first_difference(seen: list[int], prompt: list[int]) -> int:
    for index, (a, b) in enumerate(zip(seen, prompt, strict=False)):
        if a != b:
            return index
    return min(len(seen), len(prompt))
