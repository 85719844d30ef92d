"""The operator's settings: flags over environment variables over defaults, each refused by name."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

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
