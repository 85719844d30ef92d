"""The example environment servers answer NeMo Gym's `/run` end to end against the real generation server."""

from __future__ import annotations

import itertools
import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from grpojob_trainer.environments import get_environment
from grpojob_trainer.experience.conversion import result_to_sample
from grpojob_trainer.nemo_gym.protocol import Row, RunResult
from grpojob_trainer.net.http import ThreadedServer
from tests.trainer.conftest import start_environment


def run(url: str, row: dict) -> httpx.Response:
    return httpx.post(f"{url}/run", json=row, timeout=60)


def example_row(name: str, seed: int, policy_sampling) -> dict:
    """An example row with the server's sampling parameters, as the rollout client sends it."""
    row = Row.model_validate(get_environment(name).make_rows(1, seed=seed)[0])
    return policy_sampling.apply(row).model_dump(mode="json", exclude_unset=True)


def test_root_answers_ok(environment_urls):
    for url in environment_urls.values():
        assert httpx.get(url).json() == {"status": "ok"}


def test_arithmetic_run_returns_the_row_the_episode_and_a_partial_credit_reward(environment_urls, policy_sampling):
    row = example_row("arithmetic", 3, policy_sampling)

    result = run(environment_urls["arithmetic"], row).json()

    assert result["expected_answer"] == row["expected_answer"]
    assert result["agent_ref"] == {"type": "responses_api_agents", "name": "arithmetic"}
    assert 0.0 <= result["reward"] <= 1.0
    assert result["reward"] == pytest.approx(sum(result["reward_components"].values()))
    output = result["response"]["output"]
    assert [item["type"] for item in output] == ["message"]
    assert output[-1]["generation_token_ids"]
    sample = result_to_sample(RunResult.model_validate(result), group_index=0)
    assert sample.turns == 1


def test_lookup_run_spans_several_contiguous_model_calls(environment_urls, policy_sampling):
    row = example_row("lookup", 1, policy_sampling)

    result = run(environment_urls["lookup"], row).json()

    turns = [item for item in result["response"]["output"] if item.get("generation_token_ids")]
    assert len(turns) >= 2, "the random model gets nudged (or calls the tool), so the episode has several turns"
    for earlier, later in itertools.pairwise(turns):
        seen = earlier["prompt_token_ids"] + earlier["generation_token_ids"]
        assert later["prompt_token_ids"][: len(seen)] == seen
    sample = result_to_sample(RunResult.model_validate(result), group_index=4)
    assert sample.turns == len(turns)
    assert sample.group_index == 4


def test_the_lookup_tool_remembers_keys_per_session_through_the_re_issued_cookie(environment_urls):
    url = environment_urls["lookup"]
    seeded = httpx.post(f"{url}/seed_session", json={"responses_create_params": {"input": "hi"}})
    cookies = dict(seeded.cookies)
    assert list(cookies) == ["LookupEnvironment___lookup"]

    looked_up = httpx.post(f"{url}/lookup", json={"key": "apple"}, cookies=cookies)
    assert set(looked_up.json()) == {"value"}
    assert looked_up.cookies, "the cookie is re-issued on every response"

    row = get_environment("lookup").make_rows(1)[0] | {"key": "apple"}
    answer = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}]}
    body = {**row, "expected_answer": looked_up.json()["value"], "response": {"output": [answer]}}
    with_session = httpx.post(f"{url}/verify", json=body, cookies=dict(looked_up.cookies)).json()
    without_session = httpx.post(f"{url}/verify", json=body).json()
    assert with_session["reward_components"]["tool"] == pytest.approx(0.2)
    assert without_session["reward_components"]["tool"] == 0.0


def test_unknown_keys_in_responses_create_params_are_refused_with_422(environment_urls):
    row = {"responses_create_params": {"input": "hi", "frequency_penalty": 1.0}, "agent_ref": {"name": "arithmetic"}}
    assert run(environment_urls["arithmetic"], row).status_code == 422


def test_a_row_without_sampling_parameters_samples_with_the_jobs(environment_urls):
    row = get_environment("arithmetic").make_rows(1)[0]
    assert "temperature" not in row["responses_create_params"]

    response = run(environment_urls["arithmetic"], row)

    assert response.status_code == 200, response.text
    assert result_to_sample(RunResult.model_validate(response.json()), group_index=0).generated_tokens > 0


ANSWER = {
    "role": "assistant",
    "content": "7",
    "refusal": None,
    "tool_calls": None,
    "prompt_token_ids": [1, 2, 3],
    "generation_token_ids": [4, 5],
    "generation_log_probs": [-0.5, -0.25],
}


class ScriptedPolicy:
    """A policy server that answers the scripted ``(status, body)`` pairs first (a str as plain text, as
    uvicorn answers a crash), then the chat completion of `ANSWER`; it records every chat request's body
    and ``Authorization`` header."""

    def __init__(self, *script: tuple[int, object]) -> None:
        self.script = list(script)
        self.requests: list[tuple[dict, str | None]] = []
        self.app = FastAPI()

        @self.app.get("/v1/models")
        async def models() -> dict:
            return {"object": "list", "data": [{"id": "listed-policy", "object": "model"}]}

        @self.app.post("/v1/chat/completions")
        async def chat_completions(request: Request) -> Response:
            self.requests.append((await request.json(), request.headers.get("authorization")))
            if self.script:
                status, body = self.script.pop(0)
                if isinstance(body, str):
                    return PlainTextResponse(body, status_code=status)
                return JSONResponse(body, status_code=status)
            usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
            choice = {"index": 0, "message": ANSWER, "finish_reason": None, "logprobs": None}
            return JSONResponse({"id": "c", "object": "chat.completion", "choices": [choice], "usage": usage})


@contextmanager
def environment_against(policy: ScriptedPolicy, **config) -> Iterator[str]:
    """The arithmetic environment server's URL, its agent calling ``policy``."""
    with ThreadedServer(policy.app) as policy_server:
        server = start_environment("arithmetic", f"{policy_server.url}/v1", **config)
        try:
            yield server.url
        finally:
            server.stop()


def openai_error(status: int, message: str) -> dict:
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": status}}


def test_the_agent_sends_the_chat_request_with_the_bearer_token_and_keeps_the_message_without_nones(
    policy_sampling,
):
    policy = ScriptedPolicy()
    row = example_row("arithmetic", 3, policy_sampling)

    with environment_against(policy, policy_api_key="sk-test") as url:
        response = run(url, row)

    assert response.status_code == 200, response.text
    [(body, authorization)] = policy.requests
    params = row["responses_create_params"]
    assert body == {
        "model": "listed-policy",  # the row names none: the first model the policy lists
        "messages": [{"role": "user", "content": params["input"][0]["content"]}],
        "temperature": params["temperature"],
        "top_p": params["top_p"],
        "max_tokens": params["max_output_tokens"],
    }
    assert authorization == "Bearer sk-test"
    result = response.json()
    [message] = result["response"]["output"]
    assert message["status"] == "completed", "no finish_reason reads as stop"
    assert message["content"][0]["text"] == "7"
    assert message["generation_token_ids"] == [4, 5]
    assert message["generation_log_probs"] == [-0.5, -0.25]
    assert result["response"]["usage"] == {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}
    assert result["reward_components"]["exact"] == pytest.approx(0.5)


def test_a_policy_5xx_is_retried_and_the_run_succeeds(policy_sampling):
    policy = ScriptedPolicy((503, "Service Unavailable"), (500, openai_error(500, "engine restarting")))

    with environment_against(policy) as url:
        response = run(url, example_row("arithmetic", 3, policy_sampling))

    assert response.status_code == 200, response.text
    assert len(policy.requests) == 3, "two retries, then the answer"
    assert response.json()["response"]["output"][0]["generation_token_ids"] == [4, 5]


def test_a_policy_that_keeps_failing_makes_the_run_answer_502_naming_the_policy_call(policy_sampling):
    policy = ScriptedPolicy(*[(500, "Internal Server Error")] * 3)

    with environment_against(policy) as url:
        response = run(url, example_row("arithmetic", 3, policy_sampling))

    assert response.status_code == 502
    detail = response.json()["detail"]
    assert detail.startswith("the policy call failed: POST http://")
    assert "/v1/chat/completions answered 500: Internal Server Error (gave up after 3 attempts)" in detail
    assert len(policy.requests) == 3


def test_an_unreachable_policy_makes_the_run_answer_502(policy_sampling):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    server = start_environment("arithmetic", closed, policy_model_name="policy")
    try:
        response = run(server.url, example_row("arithmetic", 3, policy_sampling))
    finally:
        server.stop()

    assert response.status_code == 502
    assert response.json()["detail"].startswith("the policy call failed: POST ")
    assert "(gave up after 3 attempts)" in response.json()["detail"]


def test_a_prompt_over_the_context_length_ends_the_episode_truncated(policy_sampling):
    too_long = openai_error(400, "This model's maximum context length is 1024 tokens. However, ...")
    policy = ScriptedPolicy((400, too_long))

    with environment_against(policy) as url:
        response = run(url, example_row("arithmetic", 3, policy_sampling))

    assert response.status_code == 200, response.text
    episode = response.json()["response"]
    assert episode["status"] == "incomplete"
    assert episode["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [item["content"][0]["text"] for item in episode["output"]] == [""]
    assert "generation_token_ids" not in episode["output"][0]
    assert len(policy.requests) == 1


@pytest.mark.parametrize("status", [400, 404, 422])
def test_another_policy_4xx_is_refused_with_400_and_not_retried(policy_sampling, status):
    policy = ScriptedPolicy((status, openai_error(status, "temperature 0.5 differs from the server's 1.0")))

    with environment_against(policy) as url:
        response = run(url, example_row("arithmetic", 3, policy_sampling))

    assert response.status_code == 400
    detail = response.json()["detail"]
    assert detail.startswith("the policy refused the request: POST http://")
    assert f"answered {status}: " in detail and "temperature 0.5 differs" in detail
    assert len(policy.requests) == 1


class Case(NamedTuple):
    """A request to an environment server, what it answers, and (for an odd input) why that answer is right."""

    path: str
    body: dict
    status: int
    param: str | None = None
    """The field the refusal names (None: accepted)."""
    why: str = ""
    environment: str = "arithmetic"


MISSING = object()
"""A value that leaves its key out of the row."""
ARITHMETIC_ROW = get_environment("arithmetic").make_rows(1, seed=3)[0]
LOOKUP_ROW = get_environment("lookup").make_rows(1, seed=3)[0]
ANSWER_ITEM = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "7"}]}


def row(base: dict = ARITHMETIC_ROW, **fields) -> dict:
    """``base`` with ``fields`` set (or left out, with `MISSING`)."""
    return {key: value for key, value in {**base, **fields}.items() if value is not MISSING}


def asking(*items: dict, **params) -> dict:
    """The arithmetic row with its input replaced by ``items`` and ``params`` added."""
    return row(responses_create_params={"input": list(items) or "What is 3+4?", **params})


def verifying(*output: dict, base: dict = ARITHMETIC_ROW, **fields) -> dict:
    """A ``/verify`` body: the row (``fields`` set) and an episode of ``output`` items."""
    return {**row(base, **fields), "response": {"output": list(output or [ANSWER_ITEM])}}


def message(content: object, role: object = "user") -> dict:
    return {"type": "message", "role": role, "content": content}


INPUT = "responses_create_params.input"
MALFORMED_ROWS = {
    "/run without expected_answer": Case("/run", row(expected_answer=MISSING), 422, "expected_answer"),
    "/run with a null expected_answer": Case("/run", row(expected_answer=None), 422, "expected_answer"),
    "/verify without expected_answer": Case("/verify", verifying(expected_answer=MISSING), 422, "expected_answer"),
    "/verify with a null expected_answer": Case("/verify", verifying(expected_answer=None), 422, "expected_answer"),
    "lookup /verify without expected_answer": Case(
        "/verify", verifying(base=LOOKUP_ROW, expected_answer=MISSING), 422, "expected_answer", environment="lookup"
    ),
    "/verify integer content": Case("/verify", verifying(message(5, "assistant")), 422, "response.output[0].content"),
    "/verify integer text part": Case(
        "/verify",
        verifying(message([{"type": "output_text", "text": 5}], "assistant")),
        422,
        "response.output[0].content",
    ),
    "/run integer content": Case("/run", asking(message(5)), 422, f"{INPUT}[0].content"),
    "/run integer role": Case("/run", asking(message("hi", role=5)), 422, f"{INPUT}[0].role"),
    "/run unknown item type": Case("/run", asking({"type": "bogus"}), 422, f"{INPUT}[0].type"),
    "/run function_call without call_id": Case(
        "/run", asking({"type": "function_call", "name": "f", "arguments": "{}"}), 422, f"{INPUT}[0].call_id"
    ),
    "/run a web_search tool": Case(
        "/run", asking(tools=[{"type": "web_search"}]), 422, "responses_create_params.tools[0].type"
    ),
    "/run lone surrogate in input": Case("/run", asking(message("\ud800")), 422, f"{INPUT}[0].content"),
    "/verify lone surrogate in a task field": Case("/verify", verifying(question="\udc00"), 422, "question"),
    "/run without responses_create_params": Case(
        "/run", row(responses_create_params=MISSING), 422, "responses_create_params"
    ),
    "/run unknown key in responses_create_params": Case(
        "/run", asking(frequency_penalty=1.0), 422, "responses_create_params.frequency_penalty"
    ),
}
"""Malformed rows: each a 422 in OpenAI's error shape naming the field (a 500, or FastAPI's own 422, before)."""

ODD_ROWS = {
    "integer expected_answer": Case("/run", row(expected_answer=7), 200, None, "read as its digits"),
    "object expected_answer": Case(
        "/run", row(expected_answer={"a": 1}), 422, "expected_answer", "was compared as its Python repr"
    ),
    "lookup row without key": Case(
        "/verify",
        verifying(base=LOOKUP_ROW, key=MISSING),
        422,
        "key",
        "its tool reward could never be earned",
        "lookup",
    ),
    "agent_ref naming another environment": Case(
        "/run",
        row(agent_ref={"type": "responses_api_agents", "name": "lookup"}),
        200,
        None,
        "NeMo Gym's agents do not read it: the caller routes by it",
    ),
    "unknown task field": Case("/run", row(difficulty="easy"), 200, None, "task fields pass through, as in Gym"),
    "/seed_session without expected_answer": Case(
        "/seed_session", row(expected_answer=MISSING), 200, None, "only /verify reads the answer"
    ),
    "/verify a list of integers as content": Case(
        "/verify", verifying(message([5], "assistant")), 422, "response.output[0].content", "was read as ''"
    ),
    "/verify an unknown output item": Case(
        "/verify", verifying({"type": "bogus"}), 422, "response.output[0].type", "was ignored"
    ),
    "/run an input_image part": Case(
        "/run",
        asking(message([{"type": "input_image", "image_url": "x"}])),
        422,
        f"{INPUT}[0].content",
        "was dropped: the policy got a prompt without it",
    ),
    "/run max_output_tokens 0": Case(
        "/run", asking(max_output_tokens=0), 422, "responses_create_params.max_output_tokens", "no tokens to sample"
    ),
    "/run stream true": Case("/run", asking(stream=True), 422, "responses_create_params.stream", "Gym's rule"),
    "/run non-string metadata": Case(
        "/run", asking(metadata={"k": 1}), 422, "responses_create_params.metadata.k", "Gym's type: string to string"
    ),
}
"""Odd rows (the first seven were answered 200 before): refused when no reward could mean what the row asks."""


@pytest.mark.parametrize("case", [*MALFORMED_ROWS.values(), *ODD_ROWS.values()], ids=[*MALFORMED_ROWS, *ODD_ROWS])
def test_each_malformed_or_odd_row_gets_its_answer_naming_the_field(environment_urls, case):
    url = environment_urls[case.environment] + case.path
    response = httpx.post(url, content=json.dumps(case.body), headers={"content-type": "application/json"}, timeout=60)

    assert response.status_code == case.status, response.text
    if case.status == 200:
        assert case.path == "/seed_session" or "reward" in response.json()
        return
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == case.status
    assert error["param"] == case.param
    assert case.param in error["message"]


class ScriptedResources:
    """Another resources server: it sets a session cookie at ``/seed_session`` and answers ``/verify`` with the
    row, the response and a reward of 1, recording each call's path and the cookie it came with."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []
        self.app = FastAPI()

        @self.app.post("/seed_session")
        async def seed_session(request: Request) -> Response:
            self.calls.append(("/seed_session", request.cookies.get("episode")))
            response = JSONResponse({})
            response.set_cookie("episode", "e1")
            return response

        @self.app.post("/verify")
        async def verify(request: Request) -> dict:
            self.calls.append(("/verify", request.cookies.get("episode")))
            return {**await request.json(), "reward": 1.0}


def test_an_agent_given_another_resources_server_seeds_and_verifies_there_carrying_its_cookie(policy_sampling):
    resources = ScriptedResources()

    with ThreadedServer(resources.app) as other, environment_against(ScriptedPolicy(), resources_url=other.url) as url:
        response = run(url, example_row("arithmetic", 3, policy_sampling))

    assert response.status_code == 200, response.text
    assert resources.calls == [("/seed_session", None), ("/verify", "e1")]
    assert response.json()["reward"] == 1.0


class CrashingVerify(type(get_environment("arithmetic"))):
    """The arithmetic environment with a verification that crashes."""

    def verify(self, row: dict, response: dict, session: dict):
        raise RuntimeError("the verifier crashed")


def test_a_crash_in_the_servers_own_verify_makes_the_run_answer_502_naming_the_route(policy_sampling):
    from grpojob_trainer.environments.app import AgentConfig, create_environment_app

    with ThreadedServer(ScriptedPolicy().app) as policy:
        app = create_environment_app(CrashingVerify(), AgentConfig(f"{policy.url}/v1"))
        with ThreadedServer(app) as server:
            response = run(server.url, example_row("arithmetic", 3, policy_sampling))

    assert response.status_code == 502
    assert response.json()["detail"] == "POST /verify answered 500: Internal Server Error"
