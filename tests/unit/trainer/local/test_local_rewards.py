"""`grpojob run`'s reward server configuration: the reward file read from `path` on this machine."""

from __future__ import annotations

import json

import pytest

from grpojob_api import v1alpha1 as api
from grpojob_trainer.environments.rewards.config import RewardsConfigError, config_from_env
from grpojob_trainer.errors import UsageError
from grpojob_trainer.local.environment_processes import environment_command, local_rewards_env


def rewards(**fields) -> api.RewardsSpec:
    return api.RewardsSpec.model_validate({"functions": [{"name": "accuracy"}], **fields})


def test_grpojob_run_hands_the_server_the_local_file_as_an_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "rewards.py").write_text("def accuracy(completions, **kwargs): ...\n")
    monkeypatch.chdir(tmp_path)

    env = local_rewards_env(0, rewards(path="rewards.py", configMap={"name": "my-rewards"}))

    config = config_from_env(env)
    assert config.file == str(tmp_path / "rewards.py")
    assert [f.label for f in config.functions] == ["accuracy"]
    assert json.loads(env["GRPOJOB_REWARDS"])["timeoutSeconds"] == 30


def test_grpojob_run_needs_the_local_path_of_a_file_that_kubernetes_reads_from_a_config_map(tmp_path):
    with pytest.raises(UsageError, match=r"spec.environments\[2\].rewards.path: `grpojob run` reads the reward file"):
        local_rewards_env(2, rewards(configMap={"name": "my-rewards", "key": "r.py"}))
    with pytest.raises(UsageError, match=r"spec.environments\[0\].rewards.path: .*missing.py is not a file"):
        local_rewards_env(0, rewards(path=str(tmp_path / "missing.py")))


def test_the_environment_runs_the_reward_server():
    env = api.EnvironmentSpec.model_validate({"name": "gsm8k", "rewards": {"functions": [{"builtin": "math"}]}})
    assert environment_command(env)[1:] == ["-m", "grpojob_trainer.environments", "rewards"]


def test_a_server_without_its_configuration_says_which_variable_holds_it():
    with pytest.raises(RewardsConfigError, match="GRPOJOB_REWARDS is not set"):
        config_from_env({})
    with pytest.raises(RewardsConfigError, match=r"GRPOJOB_REWARDS: functions\[0\]: set exactly one of name"):
        config_from_env({"GRPOJOB_REWARDS": json.dumps({"functions": [{"weight": 1}]})})
