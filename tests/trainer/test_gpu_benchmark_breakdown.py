"""`benchmarks/gpu_grpo.py generation-breakdown` on the CPU: the transformers backend behind the real generation
server, the arithmetic environment as two server processes (replicas), the driver in a process of its own (the GPU
run adds vLLM and the raw replay)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_grpo.py"


def test_the_breakdown_accounts_for_every_rollout_and_splits_the_phase(tmp_path):
    overrides = ["shape=tiny", "breakdown_backend=transformers", "prompts_per_step=2", "generations_per_prompt=3"]
    overrides += ["max_new_tokens=8", "environment_replicas=2"]  # rollouts spread over two environment processes
    command = [sys.executable, str(SCRIPT), "generation-breakdown", "--out", str(tmp_path), "--steps", "2"]
    subprocess.run([*command, *(f"--set={o}" for o in overrides)], check=True, timeout=300)

    result = json.loads((tmp_path / "generation-breakdown.json").read_text())

    assert len(result["steps"]) == 2
    assert (tmp_path / "breakdown-environments" / "arithmetic-1.log").exists(), "the second replica ran"
    for step in result["steps"]:
        assert step["requests"] == step["rollouts"] == 6 and step["failed_rollouts"] == 0
        assert 0 < step["generated_tokens"] <= 6 * 8
        assert step["head_s"] > 0 and step["end_s"] > 0
        assert step["engine_window_s"] < step["wall_s"]
        assert step["driver_rollout_s"]["p50"] > step["engine_request_s"]["p50"]  # the hops take time
    assert result["median"]["wall_s"] == result["steps"][1]["wall_s"]  # the first step is the warm-up
