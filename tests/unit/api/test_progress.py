"""The trainer's progress report (`<job>-progress`), as the operator reads it back."""

from __future__ import annotations

import pytest

from grpojob_api.progress import parse_progress, progress_data


def test_progress_round_trips_and_bad_reports_are_ignored():
    report = parse_progress(progress_data(12, 0.4321))
    assert report is not None and report.step == 12 and report.mean_reward == pytest.approx(0.4321)
    assert parse_progress({}) is None
    assert parse_progress({"step": "x"}) is None
    assert parse_progress({"step": "3", "meanReward": "nan"}) is None
    assert parse_progress(progress_data(3, float("nan"))) == parse_progress({"step": "3"})
