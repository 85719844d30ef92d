"""Evaluation on held-out rows: when it runs, its numbers against hand-computed ones, which one is best."""

from __future__ import annotations

import math

import pytest

from grpojob_trainer.training.evaluation import (
    EvaluationHistory,
    EvaluationRollout,
    evaluation_due,
    evaluation_line,
    evaluation_metrics,
)


def rollouts(rewards_by_row: dict[int, list[float | None]], environment: str = "arithmetic") -> list[EvaluationRollout]:
    return [
        EvaluationRollout(row, environment, reward) for row, rewards in rewards_by_row.items() for reward in rewards
    ]


def test_known_rewards_give_the_hand_computed_mean_and_pass_at_k():
    # Row 0 passes (one of its two rollouts reaches 1.0), row 1 does not (0.5 < 1.0), row 2's rollouts both
    # failed: it counts as a row that did not pass, and its failures are left out of the mean.
    metrics = evaluation_metrics(rollouts({0: [1.0, 0.0], 1: [0.5, 0.25], 2: [None, None]}), 2, 1.0, 3.5)

    assert metrics["eval/reward/mean"] == pytest.approx((1.0 + 0.0 + 0.5 + 0.25) / 4)
    assert metrics["eval/pass@2"] == pytest.approx(1 / 3)
    assert metrics["eval/rows"] == 3 and metrics["eval/rollouts"] == 6 and metrics["eval/failed"] == 2
    assert metrics["eval/seconds"] == 3.5


def test_the_pass_threshold_decides_what_passes():
    scored = rollouts({0: [0.6], 1: [0.4]})

    assert evaluation_metrics(scored, 1, 0.5, 0.0)["eval/pass@1"] == 0.5
    assert evaluation_metrics(scored, 1, 0.7, 0.0)["eval/pass@1"] == 0.0
    assert evaluation_metrics(scored, 1, 0.4, 0.0)["eval/pass@1"] == 1.0, "reaching the threshold passes"


def test_each_environment_gets_its_own_mean_reward():
    scored = rollouts({0: [1.0, 0.0]}, "arithmetic") + rollouts({1: [0.5, 0.5]}, "lookup")

    metrics = evaluation_metrics(scored, 2, 1.0, 0.0)

    assert metrics["eval/arithmetic/reward/mean"] == 0.5 and metrics["eval/lookup/reward/mean"] == 0.5
    assert metrics["eval/reward/mean"] == 0.5


def test_an_evaluation_whose_rollouts_all_failed_has_no_mean_and_passes_nothing():
    metrics = evaluation_metrics(rollouts({0: [None], 1: [None]}), 1, 1.0, 1.0)

    assert math.isnan(metrics["eval/reward/mean"]) and metrics["eval/pass@1"] == 0.0
    assert metrics["eval/failed"] == 2


@pytest.mark.parametrize(("step", "due"), [(1, False), (4, False), (5, True), (10, True), (12, True), (11, False)])
def test_an_evaluation_is_due_every_n_steps_and_at_the_last(step: int, due: bool):
    assert evaluation_due(step, every_steps=5, max_steps=12) is due


def test_the_best_evaluation_is_the_highest_trained_one_and_the_earliest_of_equals():
    history = EvaluationHistory()

    assert not history.record(0, 0.9), "the baseline is never the best: there is no checkpoint of it"
    assert history.record(2, 0.4)
    assert history.record(4, 0.6)
    assert not history.record(6, 0.6), "an equal reward later is not better"
    assert not history.record(8, math.nan)
    assert not history.record(10, 0.5)

    assert (history.best.step, history.best.mean_reward) == (4, 0.6)
    assert history.last.step == 10


def test_the_history_survives_a_checkpoint():
    history = EvaluationHistory()
    history.record(3, 0.25)
    history.record(6, 0.125)

    restored = EvaluationHistory.from_dict(history.as_dict())

    assert restored == history
    assert EvaluationHistory.from_dict(None) == EvaluationHistory()


def test_the_log_line_says_step_reward_pass_rate_rows_failures_and_time():
    metrics = evaluation_metrics(rollouts({0: [1.0], 1: [None]}), 1, 1.0, 2.25)

    assert evaluation_line(7, metrics, 1) == (
        "evaluation of step 7: reward 1 pass@1 0.5 on 2 rows, 1 of 2 rollouts failed, 2.2s"
    )
