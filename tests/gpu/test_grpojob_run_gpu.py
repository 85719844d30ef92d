"""`grpojob run` on GPUs with the vLLM engine: the whole loop (local Ray, the arithmetic environment as a
process, the policy and the engine as Ray actors) trains, and the weights reach the engine by the path
the layout calls for: CUDA IPC when policy and engine share one GPU, NCCL broadcast when they have one each.

Runs where CUDA, vLLM and Ray are present (the H200); elsewhere every test skips and says why."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the H200)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (installed on the GPU machine)"),
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs Ray (installed on the GPU machine)"),
]

REPO = Path(__file__).resolve().parents[2]


def write_job(tmp: Path, steps: int, **spec_changes: dict | str) -> Path:
    from grpojob_trainer.environments.dataset import write_rows
    from grpojob_trainer.models.tiny import SHAPES, write_tiny_model

    model = write_tiny_model(tmp / "model", SHAPES["small"])
    write_rows("arithmetic", 16 * (steps + 1), tmp / "train.jsonl")
    job = yaml.safe_load((REPO / "examples" / "tiny-gpu.yaml").read_text())
    spec = job["spec"]
    spec["model"]["path"] = str(model)
    spec["dataset"]["path"] = str(tmp / "train.jsonl")
    spec["grpo"]["maxSteps"] = steps
    spec["checkpointing"] = {"path": str(tmp / "checkpoints"), "interval": steps}
    for field, changes in spec_changes.items():
        if isinstance(changes, dict):
            spec.setdefault(field, {}).update(changes)
        else:
            spec[field] = changes
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def grpojob_run(job: Path, out: Path, visible_gpus: str) -> str:
    env = os.environ | {
        "CUDA_VISIBLE_DEVICES": visible_gpus,
        "HF_HUB_OFFLINE": "1",
        "RAY_DISABLE_USAGE_STATS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO / p) for p in ("api", "operator", "trainer")] + sys.path),
    }
    command = [sys.executable, "-m", "grpojob_trainer.cli", "run", str(job), "--out", str(out), "--no-progress"]
    done = subprocess.run(
        command, cwd=job.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=540
    )
    assert done.returncode == 0, done.stdout[-4000:]
    return done.stdout


def metrics(out: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def assert_the_reward_rose(rows: list[dict[str, float]]) -> list[float]:
    """The mean reward of the last six steps beats the first six steps' by more than 0.05; returns the curve."""
    curve = [r["rollout/reward/mean"] for r in rows]
    first, last = sum(curve[:6]) / 6, sum(curve[-6:]) / 6
    assert last > first + 0.05, f"reward did not rise: {curve}"
    return curve


def engine_share_gib(job: Path) -> tuple[float, float]:
    """The GPU's memory and the engine's share of it (`gpuMemoryUtilization`), in GiB."""
    total = torch.cuda.get_device_properties(0).total_memory / 2**30
    return total, total * yaml.safe_load(job.read_text())["spec"]["generation"]["gpuMemoryUtilization"]


def test_grpo_on_one_gpu_raises_the_reward_and_syncs_weights_by_cuda_ipc(tmp_path: Path):
    steps = 24
    job = write_job(tmp_path, steps)
    log = grpojob_run(job, tmp_path / "out", visible_gpus="0")
    assert "weight sync: cuda-ipc" in log
    assert "the engines sleep while the policy trains (level 2)" in log
    rows = metrics(tmp_path / "out")
    # Asleep, the engine gives back most of its share: the policy trains with more than what it left.
    total, share = engine_share_gib(job)
    free = [r["weight_sync/free_gib_while_training"] for r in rows]
    print(f"free while training {min(free):.1f} GiB of {total:.1f} (engine share {share:.1f})")
    assert min(free) > total - share / 2
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    # The engine starts from the policy's weights (version 1) and gets new ones after every step.
    assert [r["weight_sync/version"] for r in rows] == [float(s + 1) for s in range(1, steps + 1)]
    for key in ("time/generation", "time/prepare", "time/training", "time/weight_sync"):
        assert all(r[key] > 0 for r in rows), key
    curve = assert_the_reward_rose(rows)
    sync = sorted(r["time/weight_sync"] for r in rows)[steps // 2]
    print(f"rewards {[round(c, 3) for c in curve]}; weight sync median {sync:.4f} s")
    assert (tmp_path / "checkpoints" / f"step_{steps:08d}" / "meta.json").exists()


def test_a_lora_policy_on_one_gpu_raises_the_reward_sending_its_adapter_to_a_sleeping_engine(tmp_path: Path):
    """The engine serves the base with LoRA and takes each new adapter in memory by CUDA IPC; asked to sleep
    while the policy trains (a LoRA policy's engine stays awake by default), it keeps its base in host memory
    (level 1)."""
    steps = 24
    lora = {"lora": {"rank": 16, "alpha": 32}, "optimizer": {"learningRate": 0.01}}
    output = {"path": str(tmp_path / "models"), "format": "adapter"}
    job = write_job(tmp_path, steps, training=lora, output=output, generation={"sleepWhileTraining": True})
    log = grpojob_run(job, tmp_path / "out", visible_gpus="0")
    assert "weight sync: cuda-ipc of the adapter" in log
    assert "the engines sleep while the policy trains (level 1)" in log
    rows = metrics(tmp_path / "out")
    assert [r["weight_sync/version"] for r in rows] == [float(s + 1) for s in range(1, steps + 1)]
    curve = assert_the_reward_rose(rows)
    sync = sorted(r["time/weight_sync"] for r in rows)[steps // 2]
    print(f"LoRA rewards {[round(c, 3) for c in curve]}; adapter sync median {sync:.4f} s")
    assert (tmp_path / "models" / "final" / "adapter_config.json").exists()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (policy on one, engine on the other)")
def test_grpo_split_over_two_gpus_syncs_weights_by_nccl_broadcast(tmp_path: Path):
    steps = 4
    log = grpojob_run(write_job(tmp_path, steps, placement="split"), tmp_path / "out", visible_gpus="0,1")
    assert "weight sync: nccl-broadcast" in log
    rows = metrics(tmp_path / "out")
    assert [r["weight_sync/version"] for r in rows] == [float(s + 1) for s in range(1, steps + 1)]
    assert all(r["weight_sync/bytes"] > 0 for r in rows)
    print(f"NCCL weight sync seconds by step: {[round(r['time/weight_sync'], 4) for r in rows]}")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (policy on one, engine on the other)")
def test_a_lora_policy_on_its_own_gpu_raises_the_reward_broadcasting_only_its_adapter(tmp_path: Path):
    """On separate GPUs the adapter alone goes over NCCL: every push the same few bytes, a small part of the
    model's, and the engine samples from each new version."""
    steps = 24
    lora = {"lora": {"rank": 16, "alpha": 32}, "optimizer": {"learningRate": 0.01}}
    job = write_job(tmp_path, steps, training=lora, placement="split")
    log = grpojob_run(job, tmp_path / "out", visible_gpus="0,1")
    assert "weight sync: nccl-broadcast of the adapter" in log
    rows = metrics(tmp_path / "out")
    assert [r["weight_sync/version"] for r in rows] == [float(s + 1) for s in range(1, steps + 1)]
    sent = {r["weight_sync/bytes"] for r in rows}
    model_bytes = sum(f.stat().st_size for f in (tmp_path / "model").glob("*.safetensors"))
    assert len(sent) == 1 and 0 < sent.pop() < model_bytes / 10, (sent, model_bytes)
    curve = assert_the_reward_rose(rows)
    syncs = [round(r["time/weight_sync"], 4) for r in rows]
    print(f"LoRA over NCCL: rewards {[round(c, 3) for c in curve]}; adapter sync seconds {syncs}")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (a rank and an engine on each)")
def test_two_colocated_ranks_each_share_their_weights_with_the_engine_on_their_gpu(tmp_path: Path):
    """generation.replicas = training.replicas = 2: colocated, each GPU holds a rank of the FSDP2 policy and an
    engine, and each rank hands the engine beside it its buckets by CUDA IPC."""
    steps = 4
    job = write_job(tmp_path, steps, generation={"replicas": 2}, training={"replicas": 2})
    log = grpojob_run(job, tmp_path / "out", visible_gpus="0,1")
    assert "colocated placement" in log and "weight sync: cuda-ipc" in log
    rows = metrics(tmp_path / "out")
    assert [r["weight_sync/version"] for r in rows] == [float(s + 1) for s in range(1, steps + 1)]
