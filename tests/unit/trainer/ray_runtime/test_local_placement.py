"""Where `grpojob run` puts the policy's ranks, and what it refuses: asynchronous GRPO needs the engine
off the policy's GPU, which one GPU cannot give."""

from __future__ import annotations

import pytest

from grpojob_api import v1alpha1 as api
from grpojob_trainer.commands.local import local_policy
from grpojob_trainer.errors import UsageError


def spec(ahead: int = 0, gpus_per_replica: int = 1) -> api.GRPOJobSpec:
    return api.GRPOJobSpec.model_validate(
        {
            "model": {"path": "m"},
            "dataset": {"path": "d.jsonl"},
            "environments": [{"name": "arithmetic"}],
            "training": {"gpusPerReplica": gpus_per_replica},
            "grpo": {"maxOffPolicySteps": ahead},
        }
    )


def test_one_gpu_shares_it_between_engine_and_policy():
    assert local_policy(spec(), gpus=1) == (1, 0.5)


def test_asynchronous_grpo_on_one_gpu_is_refused_naming_the_field():
    with pytest.raises(UsageError, match=r"spec\.grpo\.maxOffPolicySteps: 1 overlaps generation with training"):
        local_policy(spec(ahead=1), gpus=1)


@pytest.mark.parametrize(("gpus", "placement"), [(0, (1, 0)), (2, (1, 1))])
def test_asynchronous_grpo_runs_on_the_cpu_and_on_two_gpus(gpus, placement):
    assert local_policy(spec(ahead=1, gpus_per_replica=0 if gpus == 0 else 1), gpus=gpus) == placement
