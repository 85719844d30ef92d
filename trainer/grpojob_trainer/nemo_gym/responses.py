"""Responses-API items ↔ Chat Completions messages, as NeMo Gym's ``responses_converter`` does it.

Token ids (`TokenIds`: ``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs``) sit on the last
output item of each model call; converting back to chat attaches them to the merged assistant message
so the generation server can reuse those exact tokens.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from typing import Any

from grpojob_trainer.nemo_gym.protocol import TokenIds, content_text

THINK = re.compile(r"^\s*<think>(.*?)</think>", re.DOTALL)


def input_items(value: str | Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``responses_create_params.input`` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value, "type": "message"}]
    return [dict(item) for item in value]


def item_text(content: Any) -> str:
    """Text of a Responses message ``content`` (a string or text parts such as input_text/output_text; see
    `content_text`), "" for None."""
    return content_text(content) or ""


def chat_tools(tools: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses function tools → Chat Completions tools (``{"type": "function", "function": {...}}``)."""
    if not tools:
        return None
    converted = []
    for tool in tools:
        if tool.get("type", "function") != "function":
            raise ValueError(f"only function tools are supported, got {tool.get('type')!r}")
        function = {key: tool[key] for key in ("name", "description", "parameters") if key in tool}
        converted.append({"type": "function", "function": function})
    return converted


def responses_to_chat(items: Sequence[dict[str, Any]], instructions: str | None = None) -> list[dict[str, Any]]:
    """Responses input items → chat messages.

    Consecutive reasoning / assistant message / function_call items merge into one assistant message
    (reasoning as ``<think>…</think>`` before the text, calls as ``tool_calls``), closed early by an
    item that carries token ids (the end of one model call), whose ids go on the merged message.
    """
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    group: dict[str, Any] | None = None

    def close() -> None:
        nonlocal group
        if group is not None:
            thinking = "".join(f"<think>{t}</think>" for t in group.pop("_reasoning"))
            text = thinking + "".join(group.pop("_text"))
            group["content"] = text or None
            if not group["tool_calls"]:
                group["tool_calls"] = None
            messages.append({k: v for k, v in group.items() if v is not None or k == "content"})
            group = None

    for item in items:
        kind = item.get("type", "message")
        role = item.get("role")
        if kind in ("reasoning", "function_call") or (kind == "message" and role == "assistant"):
            if group is None:
                group = {"role": "assistant", "_reasoning": [], "_text": [], "tool_calls": []}
            if kind == "reasoning":
                group["_reasoning"].append("".join(s.get("text", "") for s in item.get("summary", [])))
            elif kind == "function_call":
                group["tool_calls"].append(
                    {
                        "id": item["call_id"],
                        "type": "function",
                        "function": {"name": item["name"], "arguments": item["arguments"]},
                    }
                )
            else:
                group["_text"].append(item_text(item.get("content")))
            tokens = TokenIds.carried_by(item)
            if tokens is not None:
                group.update(tokens.model_dump())
                close()
            continue
        close()
        if kind == "message":
            messages.append({"role": role, "content": item_text(item.get("content"))})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": _output_text(item["output"])})
        else:
            raise ValueError(f"unsupported input item type {kind!r}")
    close()
    return messages


def chat_to_output_items(message: dict[str, Any], finish_reason: str | None) -> list[dict[str, Any]]:
    """One chat-completion ``choices[0].message`` → Responses output items, token ids on the last item."""
    status = "incomplete" if finish_reason == "length" else "completed"
    text = message.get("content") or ""
    items: list[dict[str, Any]] = []
    think = THINK.match(text)
    if think:
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{uuid.uuid4().hex}",
                "summary": [{"type": "summary_text", "text": think.group(1)}],
            }
        )
        text = text[think.end() :]
    if text or not message.get("tool_calls"):
        items.append(
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "role": "assistant",
                "status": status,
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for call in message.get("tool_calls") or []:
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex}",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    tokens = TokenIds.carried_by(message)
    if tokens is not None:
        items[-1].update(tokens.model_dump())
    return items


def _output_text(output: Any) -> str:
    return output if isinstance(output, str) else json.dumps(output)
