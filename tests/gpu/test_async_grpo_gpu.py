"""Asynchronous GRPO on two GPUs (policy on one, the vLLM engine on the other, weights by NCCL): with
``maxOffPolicySteps: 1`` the next step's rollouts are generated while a step trains, so a step takes about
the longer of generation and training instead of their sum. The same job runs synchronously and
asynchronously; the figures are printed for docs/benchmarks.md.

Runs where two CUDA GPUs, vLLM and Ray are present (the H200 machine); elsewhere it skips and says why."""

from __future__ import annotations

import importlib.util
import itertools
import statistics
from pathlib import Path

import pytest
import torch
import yaml

from .test_grpojob_run_gpu import grpojob_run, metrics, write_job

pytestmark = [
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (runs on the H200 machine)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (installed on the GPU machine)"),
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs Ray (installed on the GPU machine)"),
]

STEPS = 10


def two_gpu_job(tmp: Path, ahead: int) -> Path:
    """The tiny GPU example with enough work per step for overlap to matter, the engine on its own GPU."""
    path = write_job(tmp, STEPS)
    job = yaml.safe_load(path.read_text())
    spec = job["spec"]
    spec["generation"] |= {"gpuMemoryUtilization": 0.8, "maxModelLen": 512, "maxNewTokens": 128}
    spec["training"]["microBatchSize"] = 32
    spec["grpo"] |= {"promptsPerStep": 32, "generationsPerPrompt": 8, "maxOffPolicySteps": ahead}
    path.write_text(yaml.safe_dump(job))
    return path


def median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows[2:])  # after the warm-up steps


def test_one_step_off_policy_overlaps_generation_with_training_on_two_gpus(tmp_path: Path):
    runs = {}
    for ahead in (0, 1):
        directory = tmp_path / f"ahead{ahead}"
        directory.mkdir()
        log = grpojob_run(two_gpu_job(directory, ahead), directory / "out", visible_gpus="0,1")
        assert "weight sync: nccl-broadcast" in log
        runs[ahead] = metrics(directory / "out")
    sync, overlapped = runs[0], runs[1]
    assert [r["step"] for r in overlapped] == list(range(1, STEPS + 1))
    assert [r["rollout/staleness/max"] for r in sync] == [0.0] * STEPS
    assert [r["rollout/staleness/max"] for r in overlapped] == [0.0] + [1.0] * (STEPS - 1)
    for trained, following in itertools.pairwise(overlapped):
        assert following["timeline/rollouts_started"] < trained["timeline/training_finished"]
        assert following["timeline/rollouts_finished"] > trained["timeline/training_started"]

    figures = {
        name: {
            key: median(rows, key)
            for key in ("time/step", "time/generation", "time/training", "time/rollout_wait", "time/weight_sync")
        }
        for name, rows in (("synchronous", sync), ("asynchronous", overlapped))
    }
    ratio = figures["asynchronous"]["time/step"] / figures["synchronous"]["time/step"]
    print(f"medians over steps 3-{STEPS}: {figures}; asynchronous / synchronous step time {ratio:.3f}")
    print(f"rewards, asynchronous: {[round(r['rollout/reward/mean'], 3) for r in overlapped]}")
    # The loop no longer waits for the whole generation: what it waits for is what training did not hide.
    assert figures["asynchronous"]["time/rollout_wait"] < figures["synchronous"]["time/rollout_wait"]
    assert ratio < 1.0, f"asynchronous GRPO was not faster: {figures}"
