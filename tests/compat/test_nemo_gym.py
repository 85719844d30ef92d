"""Our rollout collection and generation server against the real NeMo Gym 0.4.0 servers (see conftest)."""

from __future__ import annotations

import asyncio
import json
import subprocess

import httpx
import pytest

from grpojob_trainer.experience.rollouts import PolicySampling, RolloutBatch, collect_rollouts
from tests.compat.conftest import FINAL_ANSWER, MAX_NEW_TOKENS, REWARDS_AGENT, TEMPERATURE, TOP_P, Gym

pytestmark = pytest.mark.timeout(1800)

TOOL_AGENT = "example_single_tool_call_simple_agent"
SCRIPTED_AGENT = "scripted_tool_agent"
MCQA_AGENT = "mcqa_simple_agent"
SCRIPTED_MCQA_AGENT = "scripted_mcqa_agent"
SCRIPTED_FORMAT_AGENT = "scripted_format_agent"
EXAMPLE_ROWS = "resources_servers/example_single_tool_call/data/example.jsonl"


@pytest.fixture(scope="session")
def example_rows(nemo_gym_image: str) -> list[dict]:
    """NeMo Gym's own example rows of example_single_tool_call, read from the package in the image."""
    read = f"import sys, nemo_gym; sys.stdout.write((nemo_gym.PARENT_DIR / {EXAMPLE_ROWS!r}).read_text())"
    from grpojob_testing import images

    listed = subprocess.run(
        ["podman", "run", "--rm", *images.run_flags(), "--entrypoint=python", nemo_gym_image, "-c", read],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [json.loads(line) for line in listed.splitlines() if line.strip()]
    assert len(rows) >= 4 and all("temperature" not in row["responses_create_params"] for row in rows)
    return rows


def collect(
    gym: Gym, agent: str, rows: list[dict], sampling: PolicySampling | None = None, generation_url: str | None = None
) -> RolloutBatch:
    """Our rollout collection, as the trainer runs it, against one NeMo Gym agent."""
    environment_urls = {agent: gym.agents[agent]}
    collecting = collect_rollouts(
        rows,
        environment_urls,
        concurrency=4,
        timeout_s=120,
        retries=2,
        backoff_s=0.1,
        sampling=sampling,
        generation_url=generation_url,
    )
    return asyncio.run(collecting)


def test_run_results_become_training_samples_with_the_token_ids_our_server_generated(gym, policy_server, example_rows):
    sampling = PolicySampling(TEMPERATURE, TOP_P, max_output_tokens=MAX_NEW_TOKENS)

    batch = collect(gym, TOOL_AGENT, example_rows[:4], sampling)

    assert batch.failures == [], [f.error for f in batch.failures]
    for sample in batch.samples:
        assert sample.reward == 1.0
        assert sample.token_ids in policy_server.backend.sequences(), "the last call's prompt and completion"
        # Every model call of the episode (one, unless the random model answered with nothing at first):
        calls = [
            (len(prompt), result)
            for prompt, result in policy_server.backend.generated
            if sample.token_ids[: len(prompt) + len(result.token_ids)] == prompt + result.token_ids
        ]
        generated = {start + offset: lp for start, r in calls for offset, lp in enumerate(r.log_probs)}
        assert sample.generated_mask == tuple(index in generated for index in range(len(sample.token_ids)))
        assert [lp for lp, m in zip(sample.generation_log_probs, sample.generated_mask, strict=True) if m] == [
            generated[index] for index in sorted(generated)
        ]
    assert batch.metrics["rollout/count"] == 4 and batch.metrics["rollout/failed"] == 0


def test_a_tool_calling_episode_through_gym_stays_token_contiguous(gym, scripted_server, example_rows):
    row = example_rows[0]

    result = httpx.post(f"{gym.agents[SCRIPTED_AGENT]}/run", json=row, timeout=120).json()
    batch = collect(gym, SCRIPTED_AGENT, [row])

    output = result["response"]["output"]
    assert [item["type"] for item in output] == ["function_call", "function_call_output", "message"]
    assert json.loads(output[0]["arguments"]) == {"city": "sf"}
    assert "The weather in sf is cold." in output[1]["output"]
    assert output[2]["content"][0]["text"] == FINAL_ANSWER
    [sample] = batch.samples
    assert (sample.turns, sample.reward) == (2, 1.0)
    calls = [c for c in scripted_server.backend.generated if c[0] == sample.token_ids[: len(c[0])]]
    (first_prompt, first), (second_prompt, second) = calls[-2:]
    earlier = first_prompt + first.token_ids
    assert second_prompt[: len(earlier)] == earlier, "the second call's prompt extends the first call's exact tokens"
    assert sample.token_ids == second_prompt + second.token_ids
    tokenizer = scripted_server.backend.tokenizer
    between = tokenizer.decode(list(second_prompt[len(earlier) :]))
    assert "<tool_response>" in between and "The weather in sf is cold." in between
    assert [t for t, m in zip(sample.token_ids, sample.generated_mask, strict=True) if m] == [
        *first.token_ids,
        *second.token_ids,
    ]
    assert [lp for lp, m in zip(sample.generation_log_probs, sample.generated_mask, strict=True) if m] == [
        *first.log_probs,
        *second.log_probs,
    ]


def test_a_row_without_sampling_parameters_samples_with_the_jobs(gym, policy_server, example_rows):
    row = example_rows[1]
    assert not {"temperature", "top_p"} & set(row["responses_create_params"])

    batch = collect(gym, TOOL_AGENT, [row])

    assert batch.failures == [], [f.error for f in batch.failures]
    assert batch.samples[0].token_ids in policy_server.backend.sequences()


def test_a_row_whose_sampling_differs_fails_at_once_with_our_servers_message(gym, example_rows):
    row = json.loads(json.dumps(example_rows[2]))
    row["responses_create_params"]["temperature"] = 0.5

    batch = collect(gym, TOOL_AGENT, [row])

    [failure] = batch.failures
    assert failure.attempts == 1, "a 400 wrapped in NeMo Gym's 500s is not retried"
    assert "answered 500" in failure.error and "HTTP 400" in failure.error
    assert "temperature=0.5 differs from the training temperature=1.0" in failure.error
    assert batch.metrics["rollout/failed"] == 1


def test_a_prompt_longer_than_the_context_is_skipped_naming_its_length_and_max_model_len(
    gym, policy_server, example_rows
):
    """NeMo Gym's vllm_model turns our server's context-length 400 into an empty completion and /run answers
    200 with reward 0: the rollout is skipped with the prompt's length and maxModelLen, not blamed on
    missing token ids."""
    row = json.loads(json.dumps(example_rows[0]))
    row["responses_create_params"]["input"] = [{"role": "user", "content": "1 + " * 1500 + "1 =", "type": "message"}]

    batch = collect(gym, TOOL_AGENT, [row], generation_url=policy_server.base_url)

    [failure] = batch.failures
    assert failure.prompt_too_long and failure.attempts == 1, failure.error
    assert "tokens and spec.generation.maxModelLen is 1024" in failure.error
    assert "generation_token_ids" not in failure.error
    assert batch.metrics["rollout/prompt_too_long"] == 1


def format_row(pattern: str) -> dict:
    """A format_verification row (NeMo Gym's freeform_formatting rows carry their regex check in `verifier`)."""
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Answer in the format you like."}]},
        "verifier": {"type": "regex", "pattern_id": "compat", "verify_regex": [pattern], "verify_min_matches": 1},
    }


def test_a_format_verification_reward_varies_and_reaches_the_training_samples_unchanged(gym, scripted_server):
    """NeMo Gym's format_verification scores each rollout by its row's regex, with no judge or outside service:
    the scripted model answers `\\boxed{A}` to both rows, which the first row's check passes and the second's
    does not, so one group of them has non-zero advantages."""
    import torch

    from grpojob_trainer.algorithm.grpo import group_advantages

    batch = collect(gym, SCRIPTED_FORMAT_AGENT, [format_row(r"boxed\{A\}"), format_row(r"^\d+\. ")])

    assert batch.failures == [], [f.error for f in batch.failures]
    assert [sample.reward for sample in batch.samples] == [1.0, 0.0]
    for sample in batch.samples:
        assert sample.token_ids in scripted_server.backend.sequences(), "the tokens our server generated"
    advantages = group_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))
    assert advantages[0] > 0 > advantages[1]


def mcqa_row(**fields) -> dict:
    question = "Which one is a fruit? A) apple B) rock. Answer as \\boxed{LETTER}."
    row = {
        "responses_create_params": {"input": [{"role": "user", "content": question}]},
        "options": [{"A": "apple"}, {"B": "rock"}],
        "expected_answer": "A",
    }
    return row | fields


def test_a_resources_server_that_refuses_the_row_is_reported_and_not_retried(gym):
    row = mcqa_row(grading_mode="best_guess")  # not a grading mode mcqa knows: its /verify answers 422

    batch = collect(gym, MCQA_AGENT, [row], PolicySampling(TEMPERATURE, TOP_P))

    [failure] = batch.failures
    assert failure.attempts == 1
    assert "HTTP 422" in failure.error and "grading_mode" in failure.error
    assert batch.metrics["rollout/failed"] == 1


def test_a_resources_server_that_crashes_is_retried_a_bounded_number_of_times_and_reported(gym, scripted_server):
    answered = collect(gym, SCRIPTED_MCQA_AGENT, [mcqa_row()])
    # An output_regex that is not a pattern: mcqa's /verify raises TypeError on the model's answer.
    crashing = collect(gym, SCRIPTED_MCQA_AGENT, [mcqa_row(template_metadata={"output_regex": 5})])

    assert [s.reward for s in answered.samples] == [1.0], "mcqa grades the scripted answer when it does not crash"
    [failure] = crashing.failures
    assert failure.attempts == 3
    assert "answered 500" in failure.error and "TypeError" in failure.error
    assert "gave up after 3 attempts" in failure.error


def reward_row(**fields) -> dict:
    return {"responses_create_params": {"input": [{"role": "user", "content": "Say something."}]}} | fields


def test_nemo_gyms_agent_scores_rollouts_with_our_reward_functions(gym, policy_server):
    """NeMo Gym's simple_agent calls our reward server as its resources server: /seed_session, then /verify with
    the episode; the user's function and the built-in format check score it, and the per-function rewards
    reach our training samples through NeMo Gym's answer."""
    sampling = PolicySampling(TEMPERATURE, TOP_P, max_output_tokens=MAX_NEW_TOKENS)

    batch = collect(gym, REWARDS_AGENT, [reward_row(), reward_row(topic="weather")], sampling)

    assert batch.failures == [], [f.error for f in batch.failures]
    for sample in batch.samples:
        parts = dict(sample.reward_parts)
        assert set(parts) == {"answer_length", "format"}
        assert sample.reward == parts["answer_length"] + 0.5 * parts["format"]
        assert sample.token_ids in policy_server.backend.sequences()
    assert batch.metrics["reward/answer_length/mean"] > 0


def test_a_reward_function_that_raises_fails_the_rollout_through_nemo_gyms_agent_at_once(gym):
    sampling = PolicySampling(TEMPERATURE, TOP_P, max_output_tokens=MAX_NEW_TOKENS)

    batch = collect(gym, REWARDS_AGENT, [reward_row(explode=True)], sampling)

    [failure] = batch.failures
    assert failure.attempts == 1, "NeMo Gym's 500 wraps our 422: no retry"
    assert "HTTP 422" in failure.error
    assert "reward function answer_length raised on the row 'Say something.': ValueError: asked to fail" in str(
        failure.error
    )
