"""The pure pieces of `benchmarks/gpu_grpo.py`'s verl leg (the leg itself needs a GPU): the reward file against
the arithmetic environment, the rows, the Workload → verl config mapping, the result, the table; and, where verl
is installed, the overrides composed and validated as verl's entry point does."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from grpojob_trainer.environments.arithmetic import ArithmeticEnvironment
from grpojob_trainer.environments.dataset import write_rows

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_grpo.py"

COMPLETIONS = ["7", " 7 ", "7.", "The answer is 7", "77", "", "   ", "x", "12", "3 4", "9\n", "seven", "0"]
"""Answers a random policy gives, right, partly right and wrong."""


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("gpu_grpo", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_grpo"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules["gpu_grpo"]


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    path = write_rows("arithmetic", 24, tmp_path_factory.mktemp("rows") / "arithmetic.jsonl", 0)
    return [json.loads(line) for line in path.read_text().splitlines()]


def load_reward_file(path: Path):
    spec = importlib.util.spec_from_file_location("arithmetic_reward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def overrides_dict(overrides: list[str]) -> dict[str, str]:
    return dict(item.lstrip("+").split("=", 1) for item in overrides)


def test_the_reward_file_scores_each_row_as_the_arithmetic_environment(bench, rows, tmp_path):
    path = tmp_path / "arithmetic_reward.py"
    path.write_text(bench.verl_reward_source())
    reward = load_reward_file(path)  # standalone: nothing of ours imported
    environment = ArithmeticEnvironment()

    for row, verl_row in zip(rows, bench.verl_rows(rows), strict=True):
        for text in [*COMPLETIONS, row["expected_answer"], f" {row['expected_answer']}\n"]:
            response = {"output": [{"type": "message", "role": "assistant", "content": text}]}
            ours = environment.verify(row, response, {})

            scored = reward.compute_score(
                data_source=verl_row["data_source"],
                solution_str=text,
                ground_truth=verl_row["reward_model"]["ground_truth"],
                extra_info=verl_row["extra_info"],
            )

            assert scored["score"] == pytest.approx(ours.reward), (row["expected_answer"], text)
            assert {k: scored[k] for k in ours.components} == pytest.approx(ours.components)


def test_verls_rows_carry_the_chat_prompt_and_the_expected_answer(bench, rows):
    converted = bench.verl_rows(rows)

    assert len(converted) == len(rows)
    first = converted[0]
    assert first["prompt"] == [{"role": "user", "content": rows[0]["responses_create_params"]["input"][0]["content"]}]
    assert first["reward_model"]["ground_truth"] == str(rows[0]["expected_answer"])
    assert first["data_source"] == "arithmetic"
    assert [r["extra_info"]["index"] for r in converted] == list(range(len(rows)))


def test_the_overrides_map_the_workload_onto_verls_keys(bench):
    workload = bench.Workload(
        prompts_per_step=16, generations_per_prompt=16, max_new_tokens=512, micro_batch_size=8, learning_rate=1e-5
    )

    keys = overrides_dict(bench.verl_overrides(workload, Path("/m"), Path("/d.parquet"), Path("/r.py"), Path("/run")))

    assert keys["actor_rollout_ref.model.path"] == "/m"
    assert keys["data.train_files"] == "/d.parquet"
    assert keys["reward.custom_reward_function.path"] == "/r.py"
    assert keys["reward.custom_reward_function.name"] == "compute_score"
    assert keys["algorithm.adv_estimator"] == "grpo"
    assert keys["data.train_batch_size"] == "16"
    assert keys["actor_rollout_ref.actor.ppo_mini_batch_size"] == "16"  # one optimizer step per batch
    assert keys["actor_rollout_ref.rollout.n"] == "16"
    assert keys["data.max_response_length"] == "512"
    assert keys["actor_rollout_ref.actor.optim.lr"] == "1e-05"
    assert keys["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == "8"
    assert keys["actor_rollout_ref.actor.use_dynamic_bsz"] == "True"
    assert keys["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == str(8 * (256 + 512))
    assert keys["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"] == str(2 * 8 * (256 + 512))
    assert keys["actor_rollout_ref.model.use_remove_padding"] == "True"
    assert keys["actor_rollout_ref.rollout.gpu_memory_utilization"] == "0.6"
    assert keys["trainer.total_training_steps"] == str(workload.steps)
    assert keys["trainer.n_gpus_per_node"] == "1"
    assert not any("lora" in key or "target_modules" in key for key in keys)
    for key, value in bench.verl_settings(workload).items():  # every named setting is what verl is given
        assert keys[key] == str(value)


def test_a_lora_row_gives_verl_the_same_adapter(bench):
    workload = bench.Workload(lora_rank=64, verl_max_token_len_per_gpu=20000, verl_gpu_memory_utilization=0.35)

    keys = overrides_dict(bench.verl_overrides(workload, Path("/m"), Path("/d"), Path("/r"), Path("/run")))

    assert keys["actor_rollout_ref.model.lora_rank"] == "64"
    assert keys["actor_rollout_ref.model.lora_alpha"] == "128"
    assert keys["actor_rollout_ref.model.target_modules"] == "all-linear"
    assert keys["actor_rollout_ref.rollout.load_format"] == "safetensors"
    assert keys["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == "20000"
    assert keys["actor_rollout_ref.rollout.gpu_memory_utilization"] == "0.35"


def test_the_notes_say_what_differs(bench):
    default = " ".join(bench.verl_notes(bench.Workload()))
    lora = " ".join(bench.verl_notes(bench.Workload(lora_rank=64, verl_gpu_memory_utilization=0.35)))

    assert "sdpa" in default and "flash" in default
    assert "transformers>=5.5.3,<5.11" in default
    assert "memory share 0.6" in default and "memory share" not in lora  # named only where it differs
    assert "LoRA" in lora and "LoRA" not in default


def test_the_result_reads_verls_step_metrics(bench, monkeypatch):
    monkeypatch.setattr(bench, "training_flops_per_token", lambda *_, **__: 1e9)
    workload = bench.Workload(prompts_per_step=4, generations_per_prompt=2)

    def step(seconds: float, score: float) -> dict[str, float]:
        return {
            "timing_s/step": seconds,
            "timing_s/gen": seconds / 2,
            "timing_s/update_actor": seconds / 4,
            "timing_s/old_log_prob": 0.1,
            "timing_s/update_weights": 0.2,
            "perf/total_num_tokens": 800.0,
            "response_length/mean": 50.0,
            "perf/max_memory_allocated_gb": seconds,
            "critic/score/mean": score,
        }

    result = bench.verl_result([step(100.0, 0.1), step(4.0, 0.2), step(8.0, 0.3)], workload, Path("/m"))

    assert result["steps"] == 3
    assert result["step_seconds"] == 6.0  # the first step (warm-up) left out
    assert result["generation_seconds"] == 3.0
    assert result["training_seconds"] == 1.5
    assert result["generated_tokens_per_step"] == 50.0 * 8
    assert result["train_tokens_per_s"] == pytest.approx(800 / 1.5)
    assert result["training_mfu"] == pytest.approx(800 / 1.5 * 1e9 / (bench.BF16_PEAK_TFLOPS * 1e12))
    assert result["actor_max_allocated_gib"] == 100.0
    assert (result["reward_first"], result["reward_last"]) == (0.1, 0.3)


def test_the_table_sets_trl_verl_and_ours_side_by_side(bench, tmp_path):
    workload = bench.Workload()
    legs = {
        "grpo-trl": {"step_seconds": 10.0, "generation_seconds": 6.0, "training_seconds": 4.0, "peak_gpu_gib": 90.0},
        "grpo-verl": {
            "step_seconds": 8.0,
            "generation_seconds": 4.0,
            "training_seconds": 3.0,
            "peak_gpu_gib": 80.0,
            "verl_version": "0.9.1",
            "settings": bench.verl_settings(workload),
            "notes": bench.verl_notes(workload),
        },
        "grpo-ours": {"step_seconds": 6.0, "generation_seconds": 4.0, "training_seconds": 2.0, "peak_gpu_gib": 72.0},
    }
    for name, result in legs.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(result))

    table = bench.table(tmp_path)

    assert "| GRPO step, median of the steps after the first | TRL | verl | ours | ours / TRL | ours / verl |" in table
    assert "| step s | 10.000 | 8.000 | 6.000 | 0.60 | 0.75 |" in table
    assert "| peak GPU memory GiB (nvidia-smi, every process) | 90.000 | 80.000 | 72.000 | 0.80 | 0.90 |" in table
    assert "`use_remove_padding` True" in table and "`use_dynamic_bsz` True" in table
    assert "`gpu_memory_utilization` 0.6" in table
    assert "- attention: transformers' sdpa" in table


def test_the_overrides_compose_into_a_config_verl_accepts(bench, rows, tmp_path):
    pytest.importorskip("verl", reason="verl is installed on the GPU machine only (benchmarks/device/verl-wheels.txt)")
    train = tmp_path / "arithmetic.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(bench.verl_rows(rows)), train)
    workload = bench.Workload(prompts_per_step=8, generations_per_prompt=4)

    config = bench.compose_verl_config(
        bench.verl_overrides(workload, tmp_path / "model", train, tmp_path / "reward.py", tmp_path)
    )

    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    assert config.actor_rollout_ref.model.use_remove_padding is True
    assert (actor.use_dynamic_bsz, actor.ppo_max_token_len_per_gpu) == (True, 16 * (256 + 256))
    assert (rollout.name, rollout.n, rollout.gpu_memory_utilization) == ("vllm", 4, 0.6)
    assert (rollout.prompt_length, rollout.response_length) == (256, 256)
    assert config.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert config.reward.custom_reward_function.path == str(tmp_path / "reward.py")
    assert config.actor_rollout_ref.hybrid_engine is True
