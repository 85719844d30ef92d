"""The pure helpers of `benchmarks/gpu_grpo.py`'s generation breakdown (the legs themselves need a GPU)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_grpo.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("gpu_grpo", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_grpo"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules["gpu_grpo"]


def test_a_step_splits_into_hops_before_and_after_the_engine_and_its_tail(bench):
    record = bench.EngineRecord
    # the driver starts at t=10; ten requests reach the server 0.2-0.29 s later, nine answer within 1 s
    # of their arrival, one takes 3 s; the driver is done 0.1 s after the last answer
    engine = [record(10.2 + 0.01 * i, 10.2 + 0.01 * i + (3.0 if i == 9 else 1.0), (1, 2, 3), 100) for i in range(10)]
    last_out = max(r.finished for r in engine)
    driver = {
        "began": 10.0,
        "ended": last_out + 0.1,
        "spans": [(0.0, r.finished - 10.0 + 0.05) for r in engine],  # each rollout ends 0.05 s after its request
        "failed": 0,
    }

    step = bench.step_breakdown(driver, engine)

    assert step["wall_s"] == pytest.approx(last_out + 0.1 - 10.0)
    assert step["head_s"] == pytest.approx(0.2)
    assert step["end_s"] == pytest.approx(0.1)
    assert step["engine_window_s"] == pytest.approx(last_out - 10.2)
    assert step["arrival_spread_s"] == pytest.approx(0.09)
    assert step["generated_tokens"] == 1000 and step["prompt_tokens"] == 30
    assert step["tokens_per_s"] == pytest.approx(1000 / step["wall_s"])
    assert step["engine_request_s"]["max"] == pytest.approx(3.0)
    assert step["engine_request_s"]["sum"] == pytest.approx(12.0)
    # a rollout at the driver: its request's 1 s plus the 0.2 s before and 0.05 s after, plus arrival order
    assert step["hops_p50_s"] == pytest.approx(step["driver_rollout_s"]["p50"] - step["engine_request_s"]["p50"])
    assert step["hops_p50_s"] > 0.2
    assert step["tail_s"] == pytest.approx(step["engine_tail_s"])  # the straggler is the engine's
    assert step["tail_s"] > 1.5


def test_a_step_without_completed_requests_is_an_error_naming_the_rollout_errors(bench):
    with pytest.raises(ValueError, match="connection refused"):
        bench.step_breakdown({"began": 0, "ended": 1, "spans": [], "failed": 4, "errors": ["connection refused"]}, [])


def test_the_replay_keeps_each_requests_prompt_and_length_in_arrival_order(bench):
    record = bench.EngineRecord
    engine = [record(2.0, 3.0, (7, 8), 5), record(1.0, 4.0, (9,), 12)]

    assert bench.replay_step(engine) == [{"prompt": [9], "generated": 12}, {"prompt": [7, 8], "generated": 5}]


def test_medians_skip_the_warm_up_step_and_flatten_nested_figures(bench):
    steps = [
        {"wall_s": 100.0, "engine_request_s": {"p50": 50.0}, "note": "x"},
        {"wall_s": 1.0, "engine_request_s": {"p50": 0.5}, "note": "y"},
        {"wall_s": 3.0, "engine_request_s": {"p50": 1.5}, "note": "z"},
    ]

    assert bench.medians(steps) == {"wall_s": 2.0, "engine_request_s.p50": 1.0}
    assert bench.medians(steps[:1]) == {"wall_s": 100.0, "engine_request_s.p50": 50.0}


def test_a_leg_run_again_starts_from_scratch_not_from_the_last_runs_checkpoint(bench, tmp_path):
    # `grpojob run` resumes from a checkpoint it finds: a finished run left in place would make the leg train
    # no step and report the earlier run's metrics as its own
    (tmp_path / "ours-colocated").mkdir()
    (tmp_path / "ours-colocated" / "metrics.jsonl").write_text('{"step": 8}\n')
    (tmp_path / "ours-colocated-checkpoints" / "step_8").mkdir(parents=True)
    (tmp_path / "ours-2gpu").mkdir()

    run_dir = bench.clear_previous_run(tmp_path, "ours-colocated")

    assert run_dir == tmp_path / "ours-colocated"
    assert not run_dir.exists()
    assert not (tmp_path / "ours-colocated-checkpoints").exists()
    assert (tmp_path / "ours-2gpu").exists()  # another leg's run is left alone


def test_training_flops_count_no_weight_gradients_for_a_frozen_lora_base(bench, tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(10, 100), "b": torch.zeros(1000)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 8}))
    attention = 6 * 2 * 8 * 50
    assert bench.training_flops_per_token(tmp_path, 50) == 6 * 2000 + attention
    assert bench.training_flops_per_token(tmp_path, 50, frozen_base=True) == 4 * 2000 + attention
