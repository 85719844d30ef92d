"""The generation server, driven by the real `openai` client, as environments and NeMo Gym call it."""

from __future__ import annotations

import asyncio
import json
from typing import NamedTuple

import httpx
import openai
import pytest

TEMPERATURE = 1.0
TOP_P = 1.0


def chat(server, messages, **overrides):
    client = openai.OpenAI(base_url=server.base_url, api_key="dummy", max_retries=0)
    request = {"model": "tiny-policy", "messages": messages, "temperature": TEMPERATURE, "top_p": TOP_P}
    return client.chat.completions.create(**{**request, **overrides})


def test_a_completion_carries_prompt_and_generation_token_ids_and_log_probs(generation_server):
    completion = chat(generation_server, [{"role": "user", "content": "What is 2+3?"}], max_tokens=8)

    choice = completion.choices[0]
    message = choice.message
    assert completion.model == "tiny-policy"
    assert choice.finish_reason in ("stop", "length")
    assert len(message.generation_token_ids) == len(message.generation_log_probs) <= 8
    assert all(lp <= 0.0 for lp in message.generation_log_probs)
    assert completion.usage.prompt_tokens == len(message.prompt_token_ids)
    assert completion.usage.completion_tokens == len(message.generation_token_ids)


def test_the_next_turn_reuses_the_earlier_turn_tokens_exactly(generation_server):
    first_messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say a number."}]
    first = chat(generation_server, first_messages).choices[0].message
    assistant = first.model_dump(exclude_none=True)
    history = [*first_messages, assistant, {"role": "user", "content": "Another one."}]

    second = chat(generation_server, history).choices[0].message
    third_history = [*history, second.model_dump(exclude_none=True), {"role": "user", "content": "Done?"}]
    third = chat(generation_server, third_history).choices[0].message

    earlier = first.prompt_token_ids + first.generation_token_ids
    assert second.prompt_token_ids[: len(earlier)] == earlier
    assert len(second.prompt_token_ids) > len(earlier)
    later = second.prompt_token_ids + second.generation_token_ids
    assert third.prompt_token_ids[: len(later)] == later


def test_a_tool_result_after_a_tokenised_turn_extends_the_same_tokens(generation_server):
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    first = chat(generation_server, [{"role": "user", "content": "look up apple"}], tools=tools).choices[0].message
    assistant = first.model_dump(exclude_none=True)
    assistant["tool_calls"] = [
        {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "apple"}'}}
    ]
    history = [{"role": "user", "content": "look up apple"}, assistant]
    history.append({"role": "tool", "tool_call_id": "call_1", "content": '{"value": "42"}'})

    second = chat(generation_server, history, tools=tools).choices[0].message

    earlier = first.prompt_token_ids + first.generation_token_ids
    assert second.prompt_token_ids[: len(earlier)] == earlier


def test_an_off_policy_temperature_is_refused_with_both_values(generation_server):
    with pytest.raises(openai.BadRequestError) as refused:
        chat(generation_server, [{"role": "user", "content": "hi"}], temperature=0.7)

    assert refused.value.status_code == 400
    message = str(refused.value)
    assert "temperature=0.7" in message
    assert f"temperature={TEMPERATURE}" in message


@pytest.fixture(scope="module")
def greedy_server(tiny_model_dir):
    """A server whose job samples with a nucleus of one token (top_p=1e-6): every log-prob it reports is 0."""
    from grpojob_trainer.generation.app import ServerConfig
    from grpojob_trainer.generation.backend import SamplingParams
    from grpojob_trainer.generation.server import GenerationServer
    from grpojob_trainer.generation.transformers_backend import TransformersBackend

    backend = TransformersBackend(tiny_model_dir, max_model_len=1024, device="cpu")
    with GenerationServer(backend, ServerConfig("tiny-policy", SamplingParams(1.0, 1e-6, 8))) as server:
        yield server


def test_a_request_without_temperature_and_top_p_samples_with_the_jobs(greedy_server):
    client = openai.OpenAI(base_url=greedy_server.base_url, api_key="dummy", max_retries=0)

    completion = client.chat.completions.create(model="tiny-policy", messages=[{"role": "user", "content": "hi"}])

    log_probs = completion.choices[0].message.generation_log_probs
    assert log_probs and all(lp == 0.0 for lp in log_probs), "sampled inside the job's one-token nucleus"
    with pytest.raises(openai.BadRequestError, match=r"top_p=1.0 differs from the training top_p=1e-06"):
        client.chat.completions.create(model="tiny-policy", messages=[{"role": "user", "content": "hi"}], top_p=1.0)


def test_a_prompt_longer_than_the_context_is_refused(generation_server):
    with pytest.raises(openai.BadRequestError, match="maximum context length is 1024 tokens"):
        chat(generation_server, [{"role": "user", "content": "x" * 1100}])


def test_tokenize_gives_the_prompt_token_ids_a_completion_uses(generation_server):
    messages = [{"role": "user", "content": "What is 1+1?"}]
    completion = chat(generation_server, messages, max_tokens=1)

    tokens = httpx.post(f"{generation_server.url}/tokenize", json={"model": "tiny-policy", "messages": messages})

    assert tokens.status_code == 200
    assert tokens.json()["tokens"] == completion.choices[0].message.prompt_token_ids


def test_models_lists_the_served_model_name_and_health_answers(generation_server):
    client = openai.OpenAI(base_url=generation_server.base_url, api_key="dummy")
    assert [m.id for m in client.models.list().data] == ["tiny-policy"]
    assert httpx.get(f"{generation_server.url}/health").json()["status"] == "ok"


def test_an_unknown_model_name_is_a_404(generation_server):
    with pytest.raises(openai.NotFoundError):
        chat(generation_server, [{"role": "user", "content": "hi"}], model="other")


def test_concurrent_requests_all_complete(generation_server):
    async def many() -> list:
        client = openai.AsyncOpenAI(base_url=generation_server.base_url, api_key="dummy")
        requests = [
            client.chat.completions.create(
                model="tiny-policy",
                messages=[{"role": "user", "content": f"question {i}"}],
                temperature=TEMPERATURE,
                top_p=TOP_P,
                max_tokens=4 + i,
            )
            for i in range(6)
        ]
        return await asyncio.gather(*requests)

    completions = asyncio.run(many())

    for i, completion in enumerate(completions):
        assert 1 <= len(completion.choices[0].message.generation_token_ids) <= 4 + i


def test_the_rollout_prefix_of_nemo_gym_is_stripped(generation_server):
    response = httpx.get(f"{generation_server.url}/ng-rollout/rollout-7/v1/models")
    assert response.status_code == 200


class Case(NamedTuple):
    """One request body, what the server answers it, and (for an odd input) why that answer is right."""

    body: dict
    status: int
    param: str | None = None
    """The field the refusal names (None: accepted)."""
    why: str = ""


USER = [{"role": "user", "content": "hi"}]
MISSING = object()
"""A value that leaves its key out of the request."""


def body(**fields) -> dict:
    """A chat request for the tiny policy with ``fields`` set (or left out, with `MISSING`)."""
    request = {"model": "tiny-policy", "messages": USER, **fields}
    return {key: value for key, value in request.items() if value is not MISSING}


def after(*messages: dict) -> list[dict]:
    """The user's question, then ``messages``."""
    return [*USER, *messages]


def calling(**function) -> dict:
    """An assistant message calling a tool with ``function``."""
    return {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": function}]}


TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}

MALFORMED_CHAT = {
    "integer role": Case(body(messages=[{"role": 5, "content": "hi"}]), 400, "messages[0].role"),
    "null role": Case(body(messages=[{"role": None, "content": "hi"}]), 400, "messages[0].role"),
    "no role": Case(body(messages=[{"content": "hi"}]), 400, "messages[0].role"),
    "tool_calls a string": Case(
        body(messages=after({"role": "assistant", "content": "a", "tool_calls": "x"})), 400, "messages[1].tool_calls"
    ),
    "tool_calls [{}]": Case(
        body(messages=after({"role": "assistant", "content": "a", "tool_calls": [{}]})),
        400,
        "messages[1].tool_calls[0].id",
    ),
    "a tool call's name an integer": Case(
        body(messages=after(calling(name=5, arguments="{}"))),
        400,
        "messages[1].tool_calls[0].function.name",
    ),
    "lone surrogate in content": Case(
        body(messages=[{"role": "user", "content": "\ud800"}]), 400, "messages[0].content"
    ),
    "lone surrogate in a tool": Case(
        body(tools=[{**TOOL, "function": {"name": "lookup", "description": "\udfff"}}]),
        400,
        "tools[0].function.description",
    ),
    "integer content": Case(body(messages=[{"role": "user", "content": 5}]), 400, "messages[0].content"),
    "integer text part": Case(
        body(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]), 400, "messages[0].content"
    ),
    "image part": Case(
        body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        400,
        "messages[0].content",
    ),
    "integer name": Case(body(messages=[{"role": "user", "content": "hi", "name": 5}]), 400, "messages[0].name"),
    "max_tokens 0": Case(body(max_tokens=0), 400, "max_tokens"),
    "max_tokens -1": Case(body(max_tokens=-1), 400, "max_tokens"),
    "max_completion_tokens 0": Case(body(max_completion_tokens=0), 400, "max_completion_tokens"),
    "max_tokens 1.5": Case(body(max_tokens=1.5), 400, "max_tokens"),
    "no messages": Case(body(messages=MISSING), 400, "messages"),
    "messages a string": Case(body(messages="hi"), 400, "messages"),
    "a message a string": Case(body(messages=["hi"]), 400, "messages[0]"),
    "tools a string": Case(body(tools="x"), 400, "tools"),
    "temperature a string": Case(body(temperature="hot"), 400, "temperature"),
    "model an integer": Case(body(model=5), 400, "model"),
    "token ids partly sent": Case(
        body(messages=after({"role": "assistant", "content": "a", "prompt_token_ids": [1]})), 400, "messages"
    ),
    "body a list": Case([1], 400, None),  # type: ignore[arg-type]
}
"""Malformed requests: each is a 400 in OpenAI's error shape naming the field (a 500, or FastAPI's 422, before)."""

ODD_CHAT = {
    "n 2": Case(body(n=2), 400, "n", "one sample per request: a group is several requests"),
    "empty messages": Case(body(messages=[]), 400, "messages", "nothing to complete"),
    "unknown role": Case(
        body(messages=[{"role": "wizard", "content": "hi"}]),
        400,
        "messages[0].role",
        "real chat templates drop or reject it: the prompt would not be what was sent",
    ),
    "temperature 3": Case(body(temperature=3), 400, "temperature", "on-policy: training's temperature only"),
    "top_p -1": Case(body(top_p=-1), 400, "top_p", "on-policy: training's top_p only"),
    "stop list": Case(body(stop=["\n"]), 400, "stop", "was ignored: the completion ran past the stop sequence"),
    "frequency_penalty 1": Case(
        body(frequency_penalty=1.0), 400, "frequency_penalty", "was ignored: it changes the distribution (off-policy)"
    ),
    "logit_bias": Case(body(logit_bias={"5": 100}), 400, "logit_bias", "was ignored: it changes the distribution"),
    "response_format json_object": Case(
        body(response_format={"type": "json_object"}), 400, "response_format", "was ignored: no constrained decoding"
    ),
    "top_logprobs 5": Case(
        body(logprobs=True, top_logprobs=5), 400, "top_logprobs", "was ignored: only the sampled tokens' log-probs"
    ),
    "tool_choice none": Case(
        body(tools=[TOOL], tool_choice="none"), 400, "tool_choice", "was ignored: tool calls were still parsed"
    ),
    "tools [{}]": Case(body(tools=[{}]), 400, "tools[0].type", "rendered as '{}' into the prompt: no tool at all"),
    "arguments an object": Case(
        body(messages=after(calling(name="lookup", arguments={}))),
        400,
        "messages[1].tool_calls[0].function.arguments",
        "OpenAI's type is a JSON string, what the model generated and the agent sends back",
    ),
    "max_tokens beyond the context": Case(
        body(max_tokens=10**9), 400, "max_tokens", "more than the model's whole context: it could never be given"
    ),
    "max_completion_tokens beyond the context": Case(
        body(max_completion_tokens=1025), 400, "max_completion_tokens", "the model's context is 1024 tokens"
    ),
    "max_tokens the whole context": Case(
        body(max_tokens=1024), 200, None, "capped by the server's max_new_tokens and the context left, as documented"
    ),
    "no model": Case(body(model=MISSING), 200, None, "the server serves one model"),
    "extra field": Case(body(frobnicate=1), 200, None, "clients send vendor extras (NeMo Gym's, vLLM's)"),
    "seed": Case(body(seed=1), 200, None, "a seed does not change the distribution sampled from"),
    "top_logprobs 0 without logprobs": Case(
        body(top_logprobs=0), 200, None, "what NeMo Gym sends (with logprobs); asks for nothing more"
    ),
    "logprobs 'true'": Case(body(logprobs="true"), 400, "logprobs", "a JSON boolean, as OpenAI's API takes it"),
    "logprobs 1": Case(body(logprobs=1), 400, "logprobs", "a JSON boolean, as OpenAI's API takes it"),
    "max_tokens null": Case(body(max_tokens=None), 200, None, "null is absent: the server's budget"),
    "tool message without tool_call_id": Case(
        body(messages=after({"role": "tool", "content": "42"})), 200, None, "the chat template does not read it"
    ),
    "developer role": Case(body(messages=[{"role": "developer", "content": "hi"}]), 200, None, "NeMo Gym sends it"),
    "user and stream_options": Case(
        body(user="u", stream_options={"include_usage": True}), 200, None, "change nothing this server does"
    ),
}
"""Odd inputs (all but the first five were answered 200 before): refused when the answer could not be what was
asked, accepted when it is."""


def post_json(url: str, payload: object) -> httpx.Response:
    """POST ``payload`` as ASCII JSON (a lone surrogate travels as its ``\\ud800`` escape, as JSON allows)."""
    return httpx.post(url, content=json.dumps(payload), headers={"content-type": "application/json"}, timeout=60)


@pytest.mark.parametrize("case", [*MALFORMED_CHAT.values(), *ODD_CHAT.values()], ids=[*MALFORMED_CHAT, *ODD_CHAT])
def test_each_malformed_or_odd_request_gets_its_answer_naming_the_field(generation_server, case):
    response = post_json(f"{generation_server.base_url}/chat/completions", case.body)

    assert response.status_code == case.status, response.text
    if case.status == 200:
        assert response.json()["choices"][0]["message"]["generation_token_ids"]
        return
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == case.status
    assert error["param"] == case.param
    assert case.param is None or case.param in error["message"]


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"prompt": "\ud800"}, "prompt"),
        ({"messages": [{"role": 5, "content": "hi"}]}, "messages[0].role"),
        ({"messages": USER, "prompt": "x"}, "messages"),
    ],
    ids=["lone surrogate prompt", "integer role", "both messages and prompt"],
)
def test_tokenize_refuses_a_malformed_body_naming_the_field(generation_server, payload, param):
    response = post_json(f"{generation_server.url}/tokenize", payload)

    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


EVALUATION_TOKEN = "the-runs-evaluation-token"


@pytest.fixture(scope="module")
def evaluating_server(tiny_model_dir):
    """The tiny model's server with an evaluation (`spec.evaluation`): greedy, at most 4 new tokens."""
    from grpojob_trainer.generation.app import EvaluationSampling, ServerConfig
    from grpojob_trainer.generation.backend import SamplingParams
    from grpojob_trainer.generation.server import GenerationServer
    from grpojob_trainer.generation.transformers_backend import TransformersBackend

    backend = TransformersBackend(tiny_model_dir, max_model_len=1024, device="cpu")
    evaluation = EvaluationSampling(EVALUATION_TOKEN, SamplingParams(0.0, 1.0, 4))
    config = ServerConfig("tiny-policy", SamplingParams(TEMPERATURE, TOP_P, 16), evaluation=evaluation)
    with GenerationServer(backend, config) as server:
        yield server


def evaluation_request(token: str | None, **overrides) -> dict:
    request = {"model": "tiny-policy", "messages": [{"role": "user", "content": "What is 2+3?"}], "temperature": 0.0}
    if token is not None:
        request["metadata"] = {"grpojob_evaluation": token}
    return request | overrides


def test_an_evaluation_request_marked_with_the_runs_token_samples_greedily_within_its_budget(evaluating_server):
    answers = [
        httpx.post(f"{evaluating_server.base_url}/chat/completions", json=evaluation_request(EVALUATION_TOKEN))
        for _ in range(2)
    ]

    assert [a.status_code for a in answers] == [200, 200], answers[0].text
    first, second = (a.json()["choices"][0]["message"] for a in answers)
    assert first["generation_token_ids"] == second["generation_token_ids"], "greedy: the same answer twice"
    assert 1 <= len(first["generation_token_ids"]) <= 4, "the evaluation's maxNewTokens, not training's 16"


@pytest.mark.parametrize(
    ("token", "overrides", "refusal"),
    [
        (None, {}, "temperature=0.0 differs from the training temperature=1.0"),
        ("a-guessed-token", {}, "metadata.grpojob_evaluation is not this run's evaluation token"),
        ("", {}, "metadata.grpojob_evaluation is not this run's evaluation token"),
        (EVALUATION_TOKEN, {"temperature": 1.0}, "temperature=1.0 differs from the evaluation temperature=0.0"),
    ],
    ids=["unmarked", "wrong-token", "empty-token", "marked-with-training-sampling"],
)
def test_a_training_request_cannot_pass_as_an_evaluation_one(evaluating_server, token, overrides, refusal):
    answer = httpx.post(f"{evaluating_server.base_url}/chat/completions", json=evaluation_request(token, **overrides))

    assert answer.status_code == 400
    assert refusal in answer.json()["error"]["message"]


def test_a_server_without_an_evaluation_refuses_every_mark(generation_server):
    answer = httpx.post(f"{generation_server.base_url}/chat/completions", json=evaluation_request("anything"))

    assert answer.status_code == 400 and answer.json()["error"]["param"] == "metadata.grpojob_evaluation"


def test_training_rows_never_carry_an_evaluation_mark_and_evaluation_rows_carry_the_runs():
    from grpojob_trainer.experience.rollouts import PolicySampling
    from grpojob_trainer.nemo_gym.protocol import Row

    row = Row.model_validate(
        {"responses_create_params": {"input": "hi", "metadata": {"grpojob_evaluation": "forged", "team": "a"}}}
    )

    trained = PolicySampling(TEMPERATURE, TOP_P).apply(row).responses_create_params
    evaluated = PolicySampling(0.0, 1.0, 4, evaluation_token=EVALUATION_TOKEN).apply(row).responses_create_params

    assert trained.metadata == {"team": "a"}, "a row's own mark is dropped before it is sent"
    assert evaluated.metadata == {"team": "a", "grpojob_evaluation": EVALUATION_TOKEN}
    assert (evaluated.temperature, evaluated.max_output_tokens) == (0.0, 4)
    unmarked = Row.model_validate({"responses_create_params": {"input": "hi"}})
    assert (
        "metadata"
        not in PolicySampling(TEMPERATURE, TOP_P)
        .apply(unmarked)
        .model_dump(exclude_unset=True)["responses_create_params"]
    )
