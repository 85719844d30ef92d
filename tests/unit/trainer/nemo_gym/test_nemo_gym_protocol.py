"""Responses ↔ Chat conversion, strict row parameters, prefix stripping, and the example rewards."""

from __future__ import annotations

import pydantic
import pytest

from grpojob_trainer.environments.arithmetic import ArithmeticEnvironment, score_answer
from grpojob_trainer.environments.lookup import LookupEnvironment, value_of
from grpojob_trainer.experience.conversion import RolloutConversionError, result_to_sample
from grpojob_trainer.nemo_gym.protocol import (
    TOKEN_FIELDS,
    ResponsesCreateParams,
    Row,
    RunResult,
    TokenIds,
    TokenIdsError,
)
from grpojob_trainer.nemo_gym.responses import chat_to_output_items, chat_tools, input_items, responses_to_chat
from grpojob_trainer.net.http import strip_rollout_prefix

IDS = {"prompt_token_ids": [1, 2], "generation_token_ids": [3, 4], "generation_log_probs": [-0.1, -0.2]}


def test_a_string_input_is_one_user_message():
    assert input_items("hi") == [{"role": "user", "content": "hi", "type": "message"}]


def test_a_chat_message_with_a_tool_call_becomes_items_with_token_ids_on_the_last():
    message = {
        "role": "assistant",
        "content": "<think>plan</think>checking",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        **IDS,
    }

    items = chat_to_output_items(message, "tool_calls")

    assert [i["type"] for i in items] == ["reasoning", "message", "function_call"]
    assert items[0]["summary"] == [{"type": "summary_text", "text": "plan"}]
    assert items[1]["content"][0] == {"type": "output_text", "text": "checking", "annotations": []}
    assert items[2] | {"id": None} == {
        "type": "function_call", "id": None, "call_id": "call_1", "name": "f", "arguments": "{}",
        "status": "completed", **IDS,
    }  # fmt: skip
    assert all("generation_token_ids" not in i for i in items[:2])


def test_token_ids_travel_from_the_servers_message_through_the_items_back_to_chat_and_into_a_sample():
    sent = TokenIds(**IDS)
    items = chat_to_output_items({"role": "assistant", "content": "ok", **sent.model_dump()}, "stop")
    [message] = responses_to_chat(items)
    assert TokenIds.carried_by(items[-1]) == TokenIds.carried_by(message) == sent
    sample = result_to_sample(RunResult(reward=1.0, response={"output": items}), group_index=0)
    assert sample.token_ids == (1, 2, 3, 4) and sample.generation_log_probs == (0.0, 0.0, -0.1, -0.2)
    assert TOKEN_FIELDS == ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


def test_a_missing_or_renamed_token_field_is_refused_by_name_wherever_it_is_read():
    renamed = {"prompt_token_ids": [1], "generation_token_ids": [2], "generation_logprobs": [-0.1]}
    expected = r"carries \['prompt_token_ids', 'generation_token_ids'\] but not \['generation_log_probs'\]"
    with pytest.raises(TokenIdsError, match=expected):
        chat_to_output_items({"role": "assistant", "content": "a", **renamed}, "stop")
    with pytest.raises(TokenIdsError, match=expected):
        responses_to_chat([{"type": "message", "role": "assistant", "content": "a", **renamed}])
    with pytest.raises(RolloutConversionError, match="model call 0: " + expected):
        result_to_sample(RunResult(reward=1.0, response={"output": [{"type": "message", **renamed}]}), 0)


def test_generated_ids_and_log_probs_of_different_lengths_are_refused():
    with pytest.raises(TokenIdsError, match=r"generation_token_ids \(2\) and generation_log_probs \(1\) differ"):
        TokenIds.carried_by({**IDS, "generation_log_probs": [-0.1]})
    with pytest.raises(TokenIdsError, match=r"prompt_token_ids\[0\]: Input should be a valid integer"):
        TokenIds.carried_by({**IDS, "prompt_token_ids": ["one"]})


def test_a_truncated_turn_is_an_incomplete_message():
    [item] = chat_to_output_items({"role": "assistant", "content": "abc", **IDS}, "length")
    assert item["status"] == "incomplete"
    assert item["generation_token_ids"] == [3, 4]


def test_items_of_one_model_call_merge_into_one_assistant_message_carrying_its_token_ids():
    call_items = chat_to_output_items(
        {
            "role": "assistant",
            "content": "<think>t</think>ok",
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
            **IDS,
        },
        "tool_calls",
    )
    items = [
        {"role": "developer", "content": [{"type": "input_text", "text": "rules"}], "type": "message"},
        {"role": "user", "content": "go", "type": "message"},
        *call_items,
        {"type": "function_call_output", "call_id": "c", "output": '{"r": 2}'},
    ]

    messages = responses_to_chat(items, instructions="sys")

    assert messages == [
        {"role": "system", "content": "sys"},
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "<think>t</think>ok",
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
            **IDS,
        },
        {"role": "tool", "tool_call_id": "c", "content": '{"r": 2}'},
    ]


def test_two_model_calls_in_a_row_stay_two_assistant_messages():
    first = chat_to_output_items({"role": "assistant", "content": "<think>a</think>", **IDS}, "stop")
    second_ids = {k: [*v, 9] for k, v in IDS.items()}
    second = chat_to_output_items({"role": "assistant", "content": "b", **second_ids}, "stop")

    messages = responses_to_chat([*first, *second])

    assert [m["generation_token_ids"] for m in messages] == [[3, 4], [3, 4, 9]]
    assert messages[1]["content"] == "b"


def test_responses_tools_are_unwrapped_for_chat():
    tool = {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": True}
    assert chat_tools([tool]) == [
        {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
    ]


def test_responses_create_params_refuse_unknown_keys_and_rows_keep_task_fields():
    with pytest.raises(pydantic.ValidationError, match="frequency_penalty"):
        ResponsesCreateParams.model_validate({"input": "x", "frequency_penalty": 1})
    row = Row.model_validate({"responses_create_params": {"input": "x"}, "expected_answer": "7", "_ng_task_index": 3})
    assert row.task_fields() == {"expected_answer": "7", "_ng_task_index": 3}


def test_the_nemo_gym_rollout_prefix_is_stripped():
    assert strip_rollout_prefix("/ng-rollout/r1/v1/chat/completions") == "/v1/chat/completions"
    assert strip_rollout_prefix("/ng-rollout/r1/training-token-capture/run") == "/run"
    assert strip_rollout_prefix("/run") == "/run"


def test_arithmetic_rewards_give_partial_credit_that_points_at_the_answer():
    assert score_answer("7", "7") == {"digits": 0.2, "contains": 0.3, "exact": 0.5}
    assert sum(score_answer(" 7 ", "7").values()) == pytest.approx(1.0)
    assert score_answer("17", "7") == {"digits": 0.2, "contains": 0.3, "exact": 0.0}
    assert score_answer("a1", "7") == {"digits": 0.1, "contains": 0.0, "exact": 0.0}
    assert score_answer("", "7") == {"digits": 0.0, "contains": 0.0, "exact": 0.0}


def test_example_rows_are_nemo_gym_rows_for_their_environment_and_reproducible():
    arithmetic = ArithmeticEnvironment().make_rows(20, seed=1)
    assert arithmetic == ArithmeticEnvironment().make_rows(20, seed=1)
    for row in arithmetic:
        Row.model_validate(row)
        assert row["agent_ref"] == {"type": "responses_api_agents", "name": "arithmetic"}
        a, b = row["responses_create_params"]["input"][0]["content"].removeprefix("What is ").rstrip("?").split("+")
        assert row["expected_answer"] == str(int(a) + int(b))
    [lookup] = LookupEnvironment().make_rows(1)
    assert lookup["expected_answer"] == value_of(lookup["key"])
    assert lookup["responses_create_params"]["tools"][0]["name"] == "lookup"


def test_a_dataset_row_that_is_not_a_nemo_gym_row_is_refused_with_its_line_and_field(tmp_path):
    from grpojob_trainer.training.data import PromptDataset

    path = tmp_path / "rows.jsonl"
    path.write_text('{"responses_create_params": {"input": "x"}}\n\n{"responses_create_params": {"inptu": "x"}}\n')
    with pytest.raises(ValueError, match=r"rows.jsonl:3: not a NeMo Gym row: responses_create_params\.input: Field"):
        PromptDataset.from_jsonl(path)


def test_the_trainer_hands_any_nemo_gym_row_on_and_only_our_environment_servers_refuse_what_they_cannot_run():
    """A NeMo Gym environment's rows may carry images and tools our agent does not convert: the trainer reads
    and sends them as they are; our environment servers' /run refuses them (422) naming the field."""
    from grpojob_trainer.nemo_gym.protocol import EnvironmentRow, Row

    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    row = {
        "responses_create_params": {
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "what is this?"}, image]}],
            "tools": [{"type": "web_search"}],
        }
    }

    assert Row.model_validate(row).responses_create_params.input == row["responses_create_params"]["input"]
    with pytest.raises(pydantic.ValidationError, match="input"):
        EnvironmentRow.model_validate(row)
