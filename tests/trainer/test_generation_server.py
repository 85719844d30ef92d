"""The generation server, driven by the real `openai` client, as environments and NeMo Gym call it."""

from __future__ import annotations

import asyncio

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
