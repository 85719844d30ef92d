"""/run results → TrainingSamples (NeMo-RL's contiguity rule) and rollout metrics against hand-computed values."""

from __future__ import annotations

import math

import pydantic
import pytest

from grpojob_trainer.algorithm.samples import TrainingSample
from grpojob_trainer.experience.conversion import RolloutConversionError, result_to_sample
from grpojob_trainer.experience.metrics import (
    percentile,
    reward_part_metrics,
    rollout_metrics,
    summarize,
    timing_metrics,
)
from grpojob_trainer.experience.rollouts import PolicySampling
from grpojob_trainer.nemo_gym.protocol import Row, RunResult


def turn(prompt, generated, log_probs=None, **extra):
    return {"type": "message", "prompt_token_ids": prompt, "generation_token_ids": generated,
            "generation_log_probs": log_probs or [-0.5] * len(generated), **extra}  # fmt: skip


def result(*items, reward=1.0, **response):
    return RunResult.model_validate({"reward": reward, "response": {"output": list(items), **response}})


def test_two_contiguous_turns_flatten_into_one_sequence_with_a_generated_mask():
    first = turn([1, 2], [3, 4], [-0.1, -0.2])
    tool_output = {"type": "function_call_output", "call_id": "c", "output": "x"}
    second = turn([1, 2, 3, 4, 5, 6], [7], [-0.3])

    sample = result_to_sample(result(first, tool_output, second, reward=0.5), group_index=2)

    assert sample.token_ids == (1, 2, 3, 4, 5, 6, 7)
    assert sample.generated_mask == (False, False, True, True, False, False, True)
    assert sample.generation_log_probs == (0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.3)
    assert (sample.reward, sample.group_index, sample.turns, sample.truncated) == (0.5, 2, 2, False)


def test_a_later_prompt_that_rewrites_history_is_rejected():
    with pytest.raises(RolloutConversionError, match=r"model call 1 is not contiguous.*first difference at 2"):
        result_to_sample(result(turn([1, 2], [3]), turn([1, 2, 9, 4], [5])), 0)


def test_no_token_ids_nan_log_probs_and_missing_or_non_numeric_rewards_are_errors():
    with pytest.raises(RolloutConversionError, match="no output item carries generation_token_ids"):
        result_to_sample(result({"type": "message", "content": "x"}), 0)
    with pytest.raises(RolloutConversionError, match="NaN"):
        result_to_sample(result(turn([1], [2], [math.nan])), 0)
    for reward in (None, True, "1", math.inf):
        with pytest.raises(pydantic.ValidationError, match="reward"):
            result(turn([1], [2]), reward=reward)


def test_an_incomplete_response_is_a_truncated_sample():
    truncated = result(turn([1], [2]), status="incomplete", incomplete_details={"reason": "max_output_tokens"})
    assert result_to_sample(truncated, 0).truncated


def test_summaries_match_hand_computed_values():
    assert summarize([1.0, 2.0, 3.0, 6.0]) == {
        "mean": 3.0,
        "max": 6.0,
        "min": 1.0,
        "median": 2.5,
        "std": pytest.approx(math.sqrt((4 + 1 + 0 + 9) / 4)),
    }
    assert summarize([]) == {}


def test_rollout_metrics_cover_turns_tokens_reward_and_termination_rates():
    def sample(length, generated, reward, truncated, turns):
        mask = (False,) * (length - generated) + (True,) * generated
        return TrainingSample(tuple(range(length)), mask, (0.0,) * length, reward, 0, truncated, turns)

    samples = [sample(10, 4, 1.0, False, 1), sample(20, 6, 0.0, True, 3)]

    metrics = rollout_metrics(samples, failed=2)

    assert metrics["rollout/count"] == 4
    assert metrics["rollout/failed"] == 2
    assert metrics["rollout/failure_rate"] == 0.5
    assert metrics["rollout/turns/mean"] == 2.0
    assert metrics["rollout/total_tokens/max"] == 20
    assert metrics["rollout/generated_tokens/median"] == 5.0
    assert metrics["rollout/reward/std"] == 0.5
    assert metrics["rollout/natural_termination/mean"] == 0.5
    assert metrics["rollout/truncation/min"] == 0.0


def test_only_groups_whose_rewards_differ_count_as_varied():
    def sample(group: int, reward: float) -> TrainingSample:
        return TrainingSample((1, 2), (False, True), (0.0, -0.5), reward, group)

    samples = [sample(0, 1.0), sample(0, 0.0), sample(1, 1.0), sample(1, 1.0), sample(2, 0.0), sample(2, 0.25)]

    metrics = rollout_metrics(samples, failed=0)

    assert (metrics["rollout/groups"], metrics["rollout/groups_with_varied_reward"]) == (3, 2)
    assert "rollout/groups" not in rollout_metrics([], failed=4)


def test_policy_sampling_overwrites_temperature_and_top_p_and_caps_output_tokens():
    row = Row.model_validate({"responses_create_params": {"input": "x", "temperature": 0.1, "max_output_tokens": 500}})

    applied = PolicySampling(temperature=1.0, top_p=0.9, max_output_tokens=64).apply(row)

    assert applied.model_dump(mode="json", exclude_unset=True)["responses_create_params"] == {
        "input": "x",
        "temperature": 1.0,
        "top_p": 0.9,
        "max_output_tokens": 64,
    }
    assert row.responses_create_params.temperature == 0.1, "the caller's row is not modified"


def test_percentile_interpolates_between_ranks_and_refuses_nonsense():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)
    assert percentile([5.0], 90) == 5.0
    assert percentile([1.0, 9.0], 0) == 1.0 and percentile([1.0, 9.0], 100) == 9.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="within"):
        percentile([1.0], 101)


def test_timing_metrics_give_each_rollouts_time_and_the_tail_after_the_90th_percentile():
    # ten rollouts sent at once; nine end within a second, one straggles until 5 s
    spans = [(0.0, 0.1 * (i + 1)) for i in range(9)] + [(0.0, 5.0)]

    metrics = timing_metrics(spans)

    assert metrics["rollout/seconds/max"] == 5.0
    assert metrics["rollout/seconds/median"] == pytest.approx(0.55)
    assert metrics["rollout/seconds/p90"] == pytest.approx(0.9 + 0.1 * (5.0 - 0.9))
    assert metrics["rollout/tail_s"] == pytest.approx(5.0 - metrics["rollout/seconds/p90"])
    assert timing_metrics([]) == {}


def test_each_reward_functions_mean_is_logged_over_the_rows_it_applies_to():
    scored = [
        {"reward_functions": {"accuracy": 1.0, "format": 0.0}, "reward_components": {"accuracy": 1.0}},
        {"reward_functions": {"accuracy": 0.0, "format": None}},
        {"reward_components": {"accuracy": 0.5}},  # an environment without reward functions: its components
    ]
    episode = {"output": [turn([1], [2])]}
    samples = [
        result_to_sample(RunResult.model_validate({"reward": 1.0, "response": episode, **extra}), group_index=0)
        for extra in scored
    ]

    assert [s.reward_parts for s in samples] == [
        (("accuracy", 1.0), ("format", 0.0)),
        (("accuracy", 0.0),),
        (("accuracy", 0.5),),
    ]
    assert reward_part_metrics(samples) == {"reward/accuracy/mean": 0.5, "reward/format/mean": 0.0}
