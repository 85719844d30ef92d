"""The cluster path against `grpojob run` on the same GPU: one GRPOJob applied with kubectl to the real GPU
node (`benchmarks/device/e2e-gpu.sh up` first), then the same job run by `grpojob run` on the same machine.

For each leg: the seconds from `kubectl apply` (or the command's start) to the first trained step (the first
line of the job's metrics.jsonl), and the median step time after the first step, with its generation and
training phases. Prints a Markdown table and writes JSON to ``--out``.

    python benchmarks/cluster_vs_local.py --shape qwen2.5-1.5b --steps 10 --out $OUT/cluster-vs-local.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grpojob_testing.gpu_jobs import Kube, data_claim, grpo_job, local_job, trainer_environment

TERMINAL = {"Succeeded", "Failed"}


@dataclass
class Leg:
    """What one way of running the job took."""

    name: str
    to_first_step_s: float | None = None
    total_s: float = 0.0
    outcome: str = ""
    steps: list[dict] = field(default_factory=list)

    def median(self, key: str) -> float | None:
        values = [record[key] for record in self.steps[1:] if key in record]
        return statistics.median(values) if values else None


def first_metrics(pattern_dir: Path, name: str = "metrics.jsonl") -> Path | None:
    """The job's metrics file under ``pattern_dir`` once it holds a step."""
    for path in sorted(pattern_dir.rglob(name)):
        if path.stat().st_size > 0:
            return path
    return None


def read_steps(path: Path | None) -> list[dict]:
    if path is None:
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def cluster_leg(kube: Kube, namespace: str, host_dir: Path, job: dict) -> Leg:
    name = job["metadata"]["name"]
    leg = Leg("kubectl apply (cluster)")
    logs = host_dir / "logs" / name
    started = time.monotonic()
    kube.run("apply", "-n", namespace, "-f", "-", stdin=json.dumps(job))
    while True:
        phase = (kube.json("get", "grpojob", name, "-n", namespace).get("status") or {}).get("phase", "")
        if leg.to_first_step_s is None and logs.exists() and first_metrics(logs):
            leg.to_first_step_s = time.monotonic() - started
        if phase in TERMINAL:
            leg.total_s, leg.outcome = time.monotonic() - started, phase
            break
        time.sleep(0.5)
    leg.steps = read_steps(first_metrics(logs))
    # The GPU is free once the job's Ray pods are gone.
    deadline = time.monotonic() + 300
    while (
        time.monotonic() < deadline
        and kube.json("get", "pods", "-n", namespace, "-l", f"ray.io/cluster={name}")["items"]
    ):
        time.sleep(1)
    return leg


def local_leg(host_dir: Path, job: dict) -> Leg:
    leg = Leg("grpojob run")
    job_file, out = host_dir / "local-job.yaml", host_dir / "local-run"
    job_file.write_text(json.dumps(local_job(job, host_dir)))  # JSON is YAML
    command = [sys.executable, "-m", "grpojob_trainer.cli", "run", str(job_file), "--out", str(out), "--no-progress"]
    started = time.monotonic()
    with (host_dir / "local-run.log").open("w") as log:
        process = subprocess.Popen(command, env=trainer_environment(), stdout=log, stderr=subprocess.STDOUT)
        while process.poll() is None:
            if leg.to_first_step_s is None and out.exists() and first_metrics(out):
                leg.to_first_step_s = time.monotonic() - started
            time.sleep(0.5)
    leg.total_s = time.monotonic() - started
    leg.outcome = "Succeeded" if process.returncode == 0 else f"exit {process.returncode}"
    leg.steps = read_steps(out / "metrics.jsonl")
    return leg


def table(legs: list[Leg]) -> str:
    def cell(value: float | None, unit: str = "s") -> str:
        return "-" if value is None else f"{value:.2f} {unit}"

    rows = [
        "| leg | outcome | to first step | step (median after the first) | generation | training | total |",
        "|---|---|---|---|---|---|---|",
    ]
    for leg in legs:
        rows.append(
            f"| {leg.name} | {leg.outcome} | {cell(leg.to_first_step_s)} | {cell(leg.median('time/step'))} | "
            f"{cell(leg.median('time/generation'))} | {cell(leg.median('time/training'))} | {cell(leg.total_s)} |"
        )
    cluster, local = legs
    if cluster.median("time/step") and local.median("time/step"):
        rows.append(
            f"\nstep time, cluster / grpojob run: {cluster.median('time/step') / local.median('time/step'):.3f}x"
        )
    if cluster.to_first_step_s is not None and local.to_first_step_s is not None:
        rows.append(f"to first step, cluster - grpojob run: {cluster.to_first_step_s - local.to_first_step_s:+.1f} s")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen2.5-1.5b")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--kubeconfig", type=Path, default=os.environ.get("GRPOJOB_TEST_KUBECONFIG"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.kubeconfig is None:
        parser.error("--kubeconfig (or GRPOJOB_TEST_KUBECONFIG): the GPU cluster's, from e2e-gpu.sh up")
    kube = Kube(args.kubeconfig)
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    kube.run("create", "namespace", namespace)
    host_dir = data_claim(kube, namespace, args.shape, rows=32 * (args.steps + 2))
    job = grpo_job("bench", steps=args.steps, learning_rate=args.learning_rate, placement="colocated")
    try:
        legs = [cluster_leg(kube, namespace, host_dir, job), local_leg(host_dir, job)]
    finally:
        kube.run("delete", "namespace", namespace, "--wait=false", check=False)
    report = table(legs)
    print(report)
    if args.out:
        args.out.write_text(json.dumps({"shape": args.shape, "legs": [asdict(leg) for leg in legs]}, indent=2))
        args.out.with_suffix(".md").write_text(report + "\n")
    shutil.rmtree(host_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
