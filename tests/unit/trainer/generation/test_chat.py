"""Chat template, the multi-turn token splice, tool-call parsing, on-policy checks and the sampler."""

from __future__ import annotations

import math

import pytest
import torch

from grpojob_trainer.generation.app import ApiError, ChatCompletionRequest, check_on_policy, token_budget
from grpojob_trainer.generation.backend import SamplingParams
from grpojob_trainer.generation.chat import PromptError, build_prompt_token_ids, encode, parse_tool_calls
from grpojob_trainer.generation.transformers_backend import sample_next_tokens
from grpojob_trainer.models.tiny import build_tokenizer

TOKENIZER = build_tokenizer()


def test_the_template_renders_every_role_and_tool_calls_in_the_documented_format():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "value of apple?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"k": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"value": "42"}'},
    ]
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]

    text = TOKENIZER.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)

    assert text.startswith("<|im_start|>system\nBe brief.\n# Tools\n")
    assert '<|im_start|>assistant\n<tool_call>{"name": "lookup", "arguments": {"k": 1}}</tool_call><|im_end|>\n' in text
    assert '<|im_start|>tool\n<tool_response>{"value": "42"}</tool_response><|im_end|>\n' in text
    assert text.endswith("<|im_start|>assistant\n")


def test_the_tokenizer_round_trips_text_one_token_per_character():
    text = "<|im_start|>user\nWhat is 3+4?<|im_end|>\n"
    ids = encode(TOKENIZER, text)
    assert TOKENIZER.decode(ids) == text
    assert len(ids) == len("user\nWhat is 3+4?\n") + 2


def test_without_token_ids_the_prompt_is_the_tokenised_template():
    messages = [{"role": "user", "content": "hi"}]
    expected = encode(TOKENIZER, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert build_prompt_token_ids(TOKENIZER, messages) == expected


def test_a_tokenised_turn_is_spliced_in_verbatim_and_only_later_messages_are_tokenised():
    eos = TOKENIZER.eos_token_id
    # Ids that re-tokenising the rendered history would never produce: the splice must keep them as they are.
    earlier_prompt, earlier_generation = [7, 7, 7], [50, 51, eos]
    assistant = {
        "role": "assistant",
        "content": "anything",
        "prompt_token_ids": earlier_prompt,
        "generation_token_ids": earlier_generation,
        "generation_log_probs": [-1.0, -2.0, -0.5],
    }
    messages = [{"role": "user", "content": "hi"}, assistant, {"role": "user", "content": "more"}]

    ids = build_prompt_token_ids(TOKENIZER, messages)

    suffix = encode(TOKENIZER, "\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n")
    assert ids == earlier_prompt + earlier_generation + suffix


def test_the_last_tokenised_turn_wins():
    first = {"role": "assistant", "content": "a", "prompt_token_ids": [1], "generation_token_ids": [2],
             "generation_log_probs": [0.0]}  # fmt: skip
    second = {"role": "assistant", "content": "b", "prompt_token_ids": [1, 2, 9], "generation_token_ids": [3],
              "generation_log_probs": [0.0]}  # fmt: skip
    messages = [{"role": "user", "content": "x"}, first, {"role": "user", "content": "y"}, second]

    assert build_prompt_token_ids(TOKENIZER, messages)[:4] == [1, 2, 9, 3]


def test_partial_token_fields_are_refused():
    partial = {"role": "assistant", "content": "a", "prompt_token_ids": [1], "generation_token_ids": [2]}
    with pytest.raises(PromptError, match="all three or none"):
        build_prompt_token_ids(TOKENIZER, [{"role": "user", "content": "x"}, partial])


def test_tool_calls_are_parsed_out_of_the_generated_text():
    parsed = parse_tool_calls('Let me check. <tool_call>{"name": "lookup", "arguments": {"key": "apple"}}</tool_call>')

    assert parsed.content == "Let me check."
    [call] = parsed.tool_calls
    assert call["type"] == "function"
    assert call["function"] == {"name": "lookup", "arguments": '{"key": "apple"}'}
    assert call["id"].startswith("call_")


def test_a_malformed_tool_call_stays_in_the_content():
    text = "<tool_call>{not json</tool_call>"
    assert parse_tool_calls(text).content == text
    assert parse_tool_calls(text).tool_calls == []
    assert parse_tool_calls("").content is None


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], **fields)


SAMPLING = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=32)


def test_on_policy_checks_name_the_parameter_and_both_values():
    check_on_policy(request(temperature=0.8, top_p=0.95), SAMPLING)
    with pytest.raises(ApiError, match=r"top_p=0.9 differs from the training top_p=0.95") as refused:
        check_on_policy(request(temperature=0.8, top_p=0.9), SAMPLING)
    assert refused.value.status == 400
    assert refused.value.param == "top_p"
    check_on_policy(request(temperature=0.8), SAMPLING)  # an absent top_p is training's
    check_on_policy(request(), SAMPLING)
    with pytest.raises(ApiError, match="top_k"):
        check_on_policy(request(temperature=0.8, top_p=0.95, top_k=5), SAMPLING)
    with pytest.raises(ApiError, match="n=2"):
        check_on_policy(request(temperature=0.8, top_p=0.95, n=2), SAMPLING)


def test_the_token_budget_is_capped_by_the_server_and_the_context_left():
    assert token_budget(request(), prompt_len=10, sampling=SAMPLING, max_model_len=100) == 32
    assert token_budget(request(max_tokens=5), prompt_len=10, sampling=SAMPLING, max_model_len=100) == 5
    assert token_budget(request(max_completion_tokens=64), prompt_len=10, sampling=SAMPLING, max_model_len=100) == 32
    assert token_budget(request(), prompt_len=90, sampling=SAMPLING, max_model_len=100) == 10
    with pytest.raises(ApiError, match="maximum context length is 100 tokens"):
        token_budget(request(), prompt_len=100, sampling=SAMPLING, max_model_len=100)


def test_top_p_samples_only_inside_the_nucleus_and_reports_its_renormalised_log_prob():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1]])).repeat(200, 1)
    generator = torch.Generator().manual_seed(0)

    tokens, log_probs = sample_next_tokens(logits, SamplingParams(1.0, 0.8, 1), generator)

    assert set(tokens.tolist()) == {0, 1}
    expected = {0: math.log(0.6 / 0.9), 1: math.log(0.3 / 0.9)}
    assert log_probs.tolist() == pytest.approx([expected[t] for t in tokens.tolist()], abs=1e-5)


def test_temperature_scales_the_sampling_distribution_and_zero_is_greedy():
    logits = torch.tensor([[2.0, 0.0]])
    _, log_prob = sample_next_tokens(logits, SamplingParams(2.0, 1.0, 1), torch.Generator().manual_seed(0))
    assert math.exp(log_prob.item()) in (pytest.approx(1 / (1 + math.exp(-1))), pytest.approx(1 / (1 + math.exp(1))))

    token, log_prob = sample_next_tokens(logits, SamplingParams(0.0, 1.0, 1))
    assert token.tolist() == [0]
    assert log_prob.item() == pytest.approx(-math.log(1 + math.exp(-2)))
