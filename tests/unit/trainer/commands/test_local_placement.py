"""Where `grpojob run` puts the engines and the policy's ranks: the job's layout, as on Kubernetes, with every
worker pod's GPUs on this machine; and what it refuses, naming the fields: a layout that needs more GPUs than
the machine has (asynchronous GRPO needs the engine off the policy's GPU, which one GPU cannot give)."""

from __future__ import annotations

import pytest

from grpojob_api import v1alpha1 as api
from grpojob_trainer.commands.local import local_layout
from grpojob_trainer.errors import UsageError


def spec(ahead: int = 0, gpus_per_replica: int = 1, **fields: object) -> api.GRPOJobSpec:
    return api.GRPOJobSpec.model_validate(
        {
            "model": {"path": "m"},
            "dataset": {"path": "d.jsonl"},
            "environments": [{"name": "arithmetic"}],
            "generation": {"gpusPerReplica": gpus_per_replica},
            "training": {"gpusPerReplica": gpus_per_replica},
            "grpo": {"maxOffPolicySteps": ahead},
            **fields,
        }
    )


def test_one_gpu_holds_the_engine_and_the_policy_rank_half_each():
    layout = local_layout(spec(), gpus=1)
    assert (layout.placement, layout.engines, layout.ranks) == (api.Placement.COLOCATED, 1, 1)
    assert (layout.gpus_per_engine, layout.gpus_per_rank) == (0.5, 0.5)


def test_asynchronous_grpo_on_one_gpu_is_refused_naming_the_fields():
    with pytest.raises(UsageError, match=r"spec\.grpo\.maxOffPolicySteps: 0.*2 GPUs, this machine has 1"):
        local_layout(spec(ahead=1), gpus=1)


def test_split_asked_for_on_one_gpu_is_refused_naming_the_placement():
    with pytest.raises(UsageError, match=r"spec\.placement: split .* 2 GPUs, this machine has 1"):
        local_layout(spec(placement="split"), gpus=1)


def test_a_gpu_job_on_a_machine_without_gpus_is_refused():
    with pytest.raises(UsageError, match=r"gpusPerReplica.*this machine has no GPU"):
        local_layout(spec(), gpus=0)


@pytest.mark.parametrize(("gpus", "engine_gpus", "rank_gpus"), [(0, 0, 0), (2, 1, 1)])
def test_asynchronous_grpo_runs_split_on_the_cpu_and_on_two_gpus(gpus, engine_gpus, rank_gpus):
    layout = local_layout(spec(ahead=1, gpus_per_replica=min(gpus, 1)), gpus=gpus)
    assert layout.placement == api.Placement.SPLIT
    assert (layout.gpus_per_engine, layout.gpus_per_rank) == (engine_gpus, rank_gpus)


def test_two_colocated_ranks_take_two_gpus_each_beside_an_engine():
    two = {"generation": {"replicas": 2, "gpusPerReplica": 1}, "training": {"replicas": 2, "gpusPerReplica": 1}}
    layout = local_layout(api.GRPOJobSpec.model_validate(spec().model_dump(by_alias=True) | two), gpus=2)
    assert (layout.placement, layout.engines, layout.ranks, layout.gpus) == (api.Placement.COLOCATED, 2, 2, 2)
    with pytest.raises(UsageError, match=r"2 policy ranks, each with an engine beside it .* need 2 GPUs"):
        local_layout(api.GRPOJobSpec.model_validate(spec().model_dump(by_alias=True) | two), gpus=1)
