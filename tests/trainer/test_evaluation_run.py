"""`spec.evaluation` with `grpojob run`: held-out rows evaluated before training and every few steps, through
the same environment and engine with the evaluation's own (greedy) sampling, never trained on, reported in
the metrics, the log, the progress file and the reward curve; `spec.output.select: bestEvaluation` exports
the best evaluated checkpoint and keeps it from pruning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from grpojob_trainer.environments.dataset import write_rows
from grpojob_trainer.policy.checkpoint import list_checkpoints
from tests.trainer.test_grpojob_run import finish, grpojob, write_job


def test_held_out_rows_are_evaluated_never_trained_on_and_the_best_evaluation_is_exported(
    tiny_model_dir: Path, tmp_path: Path
):
    held_out = tmp_path / "held-out.jsonl"
    write_rows("arithmetic", 16, held_out, seed=7)
    job_path = write_job(tmp_path, tiny_model_dir, steps=6, interval=6)
    job = yaml.safe_load(job_path.read_text())
    job["spec"]["evaluation"] = {
        "dataset": {"path": str(held_out)},
        "everySteps": 2,
        "k": 2,
        "temperature": 0.0,
        "maxRows": 6,
    }
    job["spec"]["grpo"]["maxOffPolicySteps"] = 1  # the evaluation runs beside the next steps' rollouts
    job["spec"]["checkpointing"]["keep"] = 1
    # A learning rate this small leaves the weights as they are: every trained policy evaluates alike, so the
    # best is the earliest, step 2, not the last step, and its checkpoint must outlive `keep: 1`.
    job["spec"]["training"]["optimizer"]["learningRate"] = 1e-12
    job["spec"]["output"] = {"path": str(tmp_path / "models"), "select": "bestEvaluation", "dtype": "float32"}
    job_path.write_text(yaml.safe_dump(job))

    process = grpojob("run", str(job_path), "--out", str(tmp_path / "out"), "--no-progress", cwd=tmp_path)
    out = finish(process, 600)

    assert process.returncode == 0, out[-3000:]
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    evaluations = {r["step"]: r for r in records if "eval/reward/mean" in r}
    assert sorted(evaluations) == [0, 2, 4, 6], "a baseline, every 2 steps and the last"
    for step, record in evaluations.items():
        assert record["eval/rows"] == 6 and record["eval/rollouts"] == 12 and record["eval/failed"] == 0, record
        assert 0.0 <= record["eval/pass@2"] <= 1.0 and "eval/arithmetic/reward/mean" in record
        assert f"evaluation of step {step}: reward" in out
    for record in records:
        if "tokens" in record:  # the policy trained this step: on its training rollouts, and nothing else
            trained = record["rollout/count"] - record["rollout/failed"]
            assert record["tokens"] == pytest.approx(record["rollout/total_tokens/mean"] * trained)
            assert record["reward_mean"] == pytest.approx(record["rollout/reward/mean"])

    progress = json.loads((tmp_path / "out" / "progress.json").read_text())
    assert progress["lastEvaluation"]["step"] == 6
    best = progress["bestEvaluation"]["step"]
    assert best in (2, 4, 6) and progress["bestEvaluation"]["meanReward"] == evaluations[best]["eval/reward/mean"]
    assert progress["outputModelStep"] == best
    kept = [step for step, _ in list_checkpoints(tmp_path / "checkpoints")]
    if best != 6:  # the usual case (see the learning rate): the final model comes from the best's checkpoint
        assert f"exported the model of step {best} (the best evaluation)" in out, out[-3000:]
        assert kept == [best, 6], "the best evaluation's checkpoint is kept beside the newest"
    assert (tmp_path / "models" / "final" / "config.json").is_file()
    assert "evaluation reward" in out and (tmp_path / "out" / "reward.png").is_file()
