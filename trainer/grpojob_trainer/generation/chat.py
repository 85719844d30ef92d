"""Chat messages → prompt token ids (with the multi-turn token splice), generated text → tool calls.

The splice follows NeMo-RL's ``vllm_worker_async``: when the conversation holds an earlier assistant
message carrying ``prompt_token_ids``, ``generation_token_ids`` and ``generation_log_probs``, the
last such message's ``prompt_token_ids + generation_token_ids`` are reused verbatim as the prompt's
prefix; only the text the chat template renders after that message's end-of-sequence token is
tokenised. History is never re-tokenised, so every later prompt extends the earlier tokens exactly.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jinja2 import TemplateError

from grpojob_trainer.nemo_gym.protocol import TokenIds, TokenIdsError, content_text

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class PromptError(ValueError):
    """The messages cannot be turned into a prompt (the server answers 400 with this message)."""


def normalize_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``messages`` with text content (`content_text`), as the chat template expects."""
    normalized = []
    for index, message in enumerate(messages):
        if "role" not in message:
            raise PromptError(f"messages[{index}] has no role")
        try:
            normalized.append({**message, "content": content_text(message.get("content"))})
        except ValueError as error:
            raise PromptError(f"messages[{index}].content: {error}") from None
    return normalized


def last_tokenized_turn(messages: Sequence[dict[str, Any]]) -> tuple[int, TokenIds] | None:
    """The last assistant message that carries token ids (`TokenIds`): its index and its ids, or None."""
    found = None
    for index, message in enumerate(messages):
        try:
            tokens = TokenIds.carried_by(message)
        except TokenIdsError as error:
            raise PromptError(f"messages[{index}] {error}") from None
        if tokens is None:
            continue
        if message.get("role") != "assistant":
            raise PromptError(f"messages[{index}] carries token ids but its role is {message.get('role')!r}")
        found = (index, tokens)
    return found


def render(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Any, *, add_generation_prompt: bool) -> str:
    """The chat template applied to ``messages`` as text; raises `PromptError` when the template refuses them
    (``raise_exception``, as real templates do for roles out of order)."""
    try:
        return tokenizer.apply_chat_template(
            list(messages), tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    except TemplateError as error:
        raise PromptError(f"the chat template refused the messages: {error}") from error


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` as it stands (the template already holds any special tokens)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def build_prompt_token_ids(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Any = None, *, add_generation_prompt: bool = True
) -> list[int]:
    """Prompt token ids for a chat request, splicing in the exact tokens of the last tokenised turn."""
    messages = normalize_messages(messages)
    if not messages:
        raise PromptError("messages is empty")
    full = render(tokenizer, messages, tools, add_generation_prompt=add_generation_prompt)
    tokenized = last_tokenized_turn(messages)
    if tokenized is None:
        return encode(tokenizer, full)
    turn, tokens = tokenized
    prefix = tokens.prompt_token_ids + tokens.generation_token_ids
    head = render(tokenizer, messages[: turn + 1], tools, add_generation_prompt=False)
    if not full.startswith(head):
        raise PromptError("the chat template does not render the earlier turns as a prefix of the conversation")
    eos = tokenizer.eos_token
    cut = head.rfind(eos) if eos else -1
    if cut < 0:
        raise PromptError(f"the chat template does not end assistant messages with the EOS token {eos!r}")
    return prefix + encode(tokenizer, full[cut + len(eos) :])


@dataclass(frozen=True)
class ParsedCompletion:
    """Generated text split into assistant content and OpenAI-style tool calls."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def parse_tool_calls(text: str) -> ParsedCompletion:
    """Extract ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks from generated text.

    A block whose body is not a JSON object with a string ``name`` stays in the content untouched.
    Without tool calls the content is the text unchanged (None when empty).
    Arguments are returned as a JSON string, as in the OpenAI API.
    """
    calls: list[dict[str, Any]] = []

    def take(match: re.Match[str]) -> str:
        try:
            body = json.loads(match.group(1))
        except json.JSONDecodeError:
            return match.group(0)
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            return match.group(0)
        arguments = body.get("arguments", {})
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": body["name"],
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
        return ""

    content = TOOL_CALL.sub(take, text)
    if calls:
        content = content.strip()
    return ParsedCompletion(content=content or None, tool_calls=calls)
