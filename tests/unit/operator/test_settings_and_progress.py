from __future__ import annotations

import pytest
from pydantic import ValidationError

from grpojob_api.progress import parse_progress, progress_data
from grpojob_operator.settings import load_settings


def test_flags_override_environment_which_overrides_defaults():
    settings = load_settings(
        ["--namespace", "a", "--namespace", "b", "--log-level", "DEBUG"],
        {"GRPOJOB_CLUSTER_DOMAIN": "corp.local", "GRPOJOB_LOG_LEVEL": "WARNING", "GRPOJOB_NAMESPACES": "x"},
    )
    assert settings.namespaces == ("a", "b")
    assert settings.cluster_domain == "corp.local"
    assert settings.log_level == "DEBUG"
    assert settings.default_trainer_image() == settings.ray_image


def test_bad_settings_name_the_setting():
    with pytest.raises(ValidationError, match="reconcile_interval_seconds"):
        load_settings([], {"GRPOJOB_RECONCILE_INTERVAL_SECONDS": "-1"})


def test_progress_round_trips_and_bad_reports_are_ignored():
    report = parse_progress(progress_data(12, 0.4321))
    assert report is not None and report.step == 12 and report.mean_reward == pytest.approx(0.4321)
    assert parse_progress({}) is None
    assert parse_progress({"step": "x"}) is None
    assert parse_progress({"step": "3", "meanReward": "nan"}) is None
    assert parse_progress(progress_data(3, float("nan"))) == parse_progress({"step": "3"})
