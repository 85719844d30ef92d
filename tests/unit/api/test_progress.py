"""The trainer's progress report (in `<job>-config`), as the operator reads it back."""

from __future__ import annotations

import pytest

from grpojob_api.progress import is_worker_lost, parse_progress, progress_data, worker_lost_message


def test_progress_round_trips_and_bad_reports_are_ignored():
    report = parse_progress(progress_data(12, 0.4321))
    assert report is not None and report.step == 12 and report.mean_reward == pytest.approx(0.4321)
    assert parse_progress({}) is None
    assert parse_progress({"step": "x"}) is None
    assert parse_progress({"step": "3", "meanReward": "nan"}) is None
    assert parse_progress(progress_data(3, float("nan"))) == parse_progress({"step": "3"})


def test_evaluations_round_trip_and_an_unreadable_one_is_ignored():
    from grpojob_api.progress import EvaluationReport, evaluation_data

    data = progress_data(12, 0.5) | evaluation_data(EvaluationReport(10, 0.52), EvaluationReport(5, 0.61))
    report = parse_progress(data)

    assert report.last_evaluation == EvaluationReport(10, 0.52)
    assert report.best_evaluation == EvaluationReport(5, 0.61)
    assert parse_progress(progress_data(12, 0.5)).last_evaluation is None
    baseline = parse_progress(progress_data(0, 0.5) | evaluation_data(EvaluationReport(0, 0.25), None))
    assert baseline.last_evaluation == EvaluationReport(0, 0.25) and baseline.best_evaluation is None
    for unreadable in ("10", "x 0.5", "10 nan", "-1 0.5", "10 high"):
        assert parse_progress(progress_data(12, 0.5) | {"lastEvaluation": unreadable}).last_evaluation is None


def test_a_worker_lost_with_its_node_is_told_from_one_that_died_on_its_own():
    lost = worker_lost_message("policy", 8, "pod p, node 10.0.0.1: its node left the Ray cluster", True, "retry")
    died = worker_lost_message("generation", 8, "pod p, node 10.0.0.1: its process died", False, "retry")

    assert lost.startswith("a policy worker was lost at step 8 (") and died.startswith("a generation worker died at ")
    assert is_worker_lost(lost) and is_worker_lost(f"Error: {lost}")
    assert not is_worker_lost(died) and not is_worker_lost("Error: the policy worker was lost somewhere")


def test_what_a_stop_needs_round_trips_and_an_unreadable_report_of_it_is_ignored():
    from grpojob_api.progress import StopReport, stop_data

    measured = StopReport(185, 48.2, 21.5, 14920384512)
    assert parse_progress(progress_data(12, 0.5) | stop_data(measured)).stop == measured
    assert parse_progress(progress_data(12, 0.5)).stop is None, "before the first checkpoint"
    unsized = {**progress_data(12, 0.5), **stop_data(StopReport(185, 48.2, 21.5))}
    assert unsized["checkpointBytes"] is None, "a merge patch deletes an earlier attempt's size"
    unsized.pop("checkpointBytes")
    assert parse_progress(unsized).stop == StopReport(185, 48.2, 21.5)
    for unreadable in ({"stopSeconds": "x"}, {"stopSeconds": "0"}, {"checkpointWriteSeconds": "nan"}):
        assert parse_progress(progress_data(12, 0.5) | stop_data(measured) | unreadable).stop is None
    assert parse_progress(progress_data(12, 0.5) | stop_data(measured) | {"checkpointBytes": "big"}).stop == (
        StopReport(185, 48.2, 21.5)
    ), "an unreadable size is left out"
    report = parse_progress(progress_data(12, 0.5) | stop_data(measured))
    assert (report.step, report.mean_reward) == (12, 0.5), "the step's progress is read as before"


def test_the_operator_keeps_what_the_trainer_reports_of_a_stop_in_its_config_map():
    from grpojob_api.progress import REPORT_KEYS, StopReport, stop_data

    assert set(stop_data(StopReport(185, 48.2, 21.5, 1))) <= REPORT_KEYS


def test_an_early_stops_line_round_trips_with_its_attempt_and_an_unreadable_one_is_ignored():
    from grpojob_api.progress import StoppedReport, parse_stopped, stopped_data

    line = "preempted at step 12; checkpoint /checkpoints/demo/step_00000012"
    assert parse_stopped(stopped_data(StoppedReport(3, line))) == StoppedReport(3, line)
    assert parse_stopped({}) is None
    assert parse_stopped({"stopped": "three preempted"}) is None, "no attempt"
    assert parse_stopped({"stopped": "3 "}) is None, "no line"
    assert parse_stopped({"step": "4"}) is None
