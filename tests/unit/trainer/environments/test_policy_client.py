"""The agent's policy client reads the policy's JSON as the ``openai`` SDK's models gave it to the agent."""

from __future__ import annotations

from openai.types.chat import ChatCompletion

from grpojob_trainer.environments.policy_client import drop_none, retryable


def completion(message: dict) -> dict:
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls", "logprobs": None}
    return {"id": "c", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice]}


def test_a_message_without_its_nones_is_what_the_sdk_dumped_with_exclude_none():
    message = {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "a"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "lookup", "arguments": "{}"}, "index": None},
        ],
        "reasoning_content": None,  # an extra key, as vLLM sends it
        "prompt_token_ids": [1, 2, 3],
        "generation_token_ids": [4, 5],
        "generation_log_probs": [-0.5, -0.25],
    }
    sdk_message = ChatCompletion.model_validate(completion(message)).choices[0].message

    assert drop_none(message) == sdk_message.model_dump(mode="json", exclude_none=True)
    assert drop_none(message)["tool_calls"][1] == {
        "id": "call_2",
        "type": "function",
        "function": {"name": "lookup", "arguments": "{}"},
    }
    assert "content" not in drop_none(message)


def test_empty_lists_and_list_items_stay():
    assert drop_none({"tool_calls": [], "ids": [1, None], "content": ""}) == {
        "tool_calls": [],
        "ids": [1, None],
        "content": "",
    }


def test_timeouts_conflicts_rate_limits_and_server_errors_are_retried_other_statuses_not():
    assert [status for status in (400, 401, 403, 404, 408, 409, 422, 429, 500, 502, 503, 504) if retryable(status)] == [
        408,
        409,
        429,
        500,
        502,
        503,
        504,
    ]
