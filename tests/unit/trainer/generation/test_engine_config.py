"""An engine's config is built once on the driver from the job's spec: what the engine's Ray actor is handed, with
every value derived (memory share, sleep, LoRA rank, parallelism, sampling) and nothing left to validate."""

from __future__ import annotations

from typing import Any

from grpojob_api import v1alpha1 as api
from grpojob_trainer.generation.config import EngineConfig


def spec(**fields: Any) -> api.GRPOJobSpec:
    return api.GRPOJobSpec.model_validate(
        {"model": {"path": "m"}, "dataset": {"path": "d.jsonl"}, "environments": [{"name": "arithmetic"}], **fields}
    )


def test_an_engine_sharing_the_policys_gpu_takes_the_colocated_share_and_sleeps_for_full_weights():
    config = EngineConfig.from_spec(spec(), "/models/m", seed=7, shares_gpu=True)

    assert (config.memory_share, config.sleeps, config.lora_rank) == (api.COLOCATED_ENGINE_MEMORY_SHARE, True, None)
    assert (config.model_path, config.max_model_len, config.seed) == ("/models/m", 4096, 7)


def test_an_engine_with_gpus_of_its_own_takes_the_split_share_and_never_sleeps():
    config = EngineConfig.from_spec(spec(), "m", seed=0, shares_gpu=False)

    assert (config.memory_share, config.sleeps) == (api.SPLIT_ENGINE_MEMORY_SHARE, False)


def test_the_asked_memory_share_parallelism_and_lora_rank_reach_the_engine():
    asked = spec(
        generation={"backend": "vllm", "gpusPerReplica": 2, "gpuMemoryUtilization": 0.6, "maxModelLen": 2048},
        training={"gpusPerReplica": 2, "lora": {"rank": 8}},
        placement="split",
    )

    config = EngineConfig.from_spec(asked, "m", seed=0, shares_gpu=False)

    assert (config.backend, config.memory_share, config.tensor_parallel_size) == (api.GenerationBackend.VLLM, 0.6, 2)
    assert (config.lora_rank, config.max_model_len) == (8, 2048)


def test_each_engine_of_a_group_samples_with_a_seed_of_its_own():
    config = EngineConfig.from_spec(spec(), "m", seed=10, shares_gpu=False)

    assert [config.for_engine(i).seed for i in range(3)] == [10, 11, 12]


def test_the_server_samples_as_the_spec_says_and_evaluates_only_with_a_token():
    asked = spec(
        generation={"temperature": 0.7, "topP": 0.9, "maxNewTokens": 64},
        evaluation={"dataset": {"path": "e.jsonl"}, "temperature": 0.0},
    )

    without = EngineConfig.from_spec(asked, "m", seed=0, shares_gpu=False)
    marked = EngineConfig.from_spec(asked, "m", seed=0, shares_gpu=False, evaluation_token="secret")

    sampling = without.server.sampling
    assert (sampling.temperature, sampling.top_p, sampling.max_new_tokens) == (0.7, 0.9, 64)
    assert without.server.evaluation is None
    assert marked.server.evaluation is not None
    assert (marked.server.evaluation.token, marked.server.evaluation.sampling.temperature) == ("secret", 0.0)


def test_the_evaluation_secret_stays_out_of_the_config_as_it_is_logged():
    asked = spec(evaluation={"dataset": {"path": "e.jsonl"}, "temperature": 0.0})

    config = EngineConfig.from_spec(asked, "m", seed=0, shares_gpu=True, evaluation_token="s3cr3t-token")

    assert config.server.evaluation is not None and config.server.evaluation.token == "s3cr3t-token"
    assert "s3cr3t-token" not in repr(config)
