"""The example environment servers answer NeMo Gym's `/run` end to end against the real generation server."""

from __future__ import annotations

import itertools

import httpx
import pytest

from grpojob_trainer.environments import get_environment
from grpojob_trainer.penguin.conversion import result_to_sample
from grpojob_trainer.penguin.protocol import Row, RunResult


def run(url: str, row: dict) -> httpx.Response:
    return httpx.post(f"{url}/run", json=row, timeout=60)


def example_row(name: str, seed: int, policy_sampling) -> dict:
    """An example row with the server's sampling parameters, as the rollout client sends it."""
    row = Row.model_validate(get_environment(name).make_rows(1, seed=seed)[0])
    return policy_sampling.apply(row).model_dump(mode="json", exclude_unset=True)


def test_root_answers_ok(env_urls):
    for url in env_urls.values():
        assert httpx.get(url).json() == {"status": "ok"}


def test_arithmetic_run_returns_the_row_the_episode_and_a_partial_credit_reward(env_urls, policy_sampling):
    row = example_row("arithmetic", 3, policy_sampling)

    result = run(env_urls["arithmetic"], row).json()

    assert result["expected_answer"] == row["expected_answer"]
    assert result["agent_ref"] == {"type": "responses_api_agents", "name": "arithmetic"}
    assert 0.0 <= result["reward"] <= 1.0
    assert result["reward"] == pytest.approx(sum(result["reward_components"].values()))
    output = result["response"]["output"]
    assert [item["type"] for item in output] == ["message"]
    assert output[-1]["generation_token_ids"]
    sample = result_to_sample(RunResult.model_validate(result), group_index=0)
    assert sample.turns == 1


def test_lookup_run_spans_several_contiguous_model_calls(env_urls, policy_sampling):
    row = example_row("lookup", 1, policy_sampling)

    result = run(env_urls["lookup"], row).json()

    turns = [item for item in result["response"]["output"] if item.get("generation_token_ids")]
    assert len(turns) >= 2, "the random model gets nudged (or calls the tool), so the episode has several turns"
    for earlier, later in itertools.pairwise(turns):
        seen = earlier["prompt_token_ids"] + earlier["generation_token_ids"]
        assert later["prompt_token_ids"][: len(seen)] == seen
    sample = result_to_sample(RunResult.model_validate(result), group_index=4)
    assert sample.turns == len(turns)
    assert sample.group_index == 4


def test_the_lookup_tool_remembers_keys_per_session_through_the_re_issued_cookie(env_urls):
    url = env_urls["lookup"]
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


def test_unknown_keys_in_responses_create_params_are_refused_with_422(env_urls):
    row = {"responses_create_params": {"input": "hi", "frequency_penalty": 1.0}, "agent_ref": {"name": "arithmetic"}}
    assert run(env_urls["arithmetic"], row).status_code == 422


def test_a_row_without_sampling_parameters_samples_with_the_jobs(env_urls):
    row = get_environment("arithmetic").make_rows(1)[0]
    assert "temperature" not in row["responses_create_params"]

    response = run(env_urls["arithmetic"], row)

    assert response.status_code == 200, response.text
    assert result_to_sample(RunResult.model_validate(response.json()), group_index=0).generated_tokens > 0
