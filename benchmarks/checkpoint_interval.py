"""What checkpoints cost a run: the median step time of `grpojob run` on the tiny example with a checkpoint every
step (``spec.checkpointing.interval: 1``) against one every ten steps, on this machine.

Each leg runs an example's job (by default the tiny example: the tiny random model, the arithmetic environment, the
transformers backend on the CPU; ``--example examples/tiny-gpu.yaml --shape qwen2.5-1.5b`` puts vLLM and the
policy on one GPU with a random model of that shape, ``--lora-rank`` trains an adapter) for ``--steps`` steps
from nothing, and reads its ``metrics.jsonl``: the median ``time/step`` of steps 2 onwards,
and the medians of ``time/checkpoint`` (what the step waited for its checkpoint) and ``time/checkpoint_write`` (the
write, where it runs beside training) over the steps that logged them. The legs alternate, ``--repeats`` times each;
the table's medians are over the steps of every repeat together. Prints a Markdown table and writes JSON to
``--json``.

    python benchmarks/checkpoint_interval.py --steps 30 --repeats 2 --json checkpoint-interval.json
    python benchmarks/checkpoint_interval.py --example examples/tiny-gpu.yaml --shape qwen2.5-1.5b --lora-rank 64 \
        --steps 12 --repeats 1
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def write_job(work: Path, example: dict, args: argparse.Namespace, model: Path, data: Path, interval: int) -> Path:
    job = copy.deepcopy(example)
    job["spec"]["model"]["path"] = str(model)
    if args.lora_rank:
        job["spec"]["training"]["lora"] = {"rank": args.lora_rank, "alpha": 2 * args.lora_rank}
    if args.eager:
        job["spec"]["training"]["torchCompile"] = False
    job["spec"]["dataset"]["path"] = str(data)
    job["spec"]["grpo"]["maxSteps"] = args.steps
    job["spec"]["checkpointing"] = {"path": str(work / "checkpoints"), "interval": interval}
    path = work / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def median_of(records: list[dict], key: str) -> float | None:
    values = [record[key] for record in records if key in record]
    return statistics.median(values) if values else None


def run_leg(
    root: Path, example: dict, args: argparse.Namespace, model: Path, data: Path, interval: int, index: int
) -> dict:
    work = root / f"interval-{interval}-{index}"
    work.mkdir(parents=True)
    job = write_job(work, example, args, model, data, interval)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "grpojob_trainer.cli", "run", str(job), "--out", str(work / "out"), "--no-progress"],
        cwd=work,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "RAY_DISABLE_USAGE_STATS": "1"},
    )
    if done.returncode != 0:
        raise SystemExit(f"grpojob run (interval {interval}) failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (work / "out" / "metrics.jsonl").read_text().splitlines() if line]
    timed = records[1:]  # the first step warms up
    return {
        "interval": interval,
        "steps": len(records),
        "step_s": median_of(timed, "time/step"),
        "checkpoint_s": median_of(timed, "time/checkpoint"),
        "checkpoint_write_s": median_of(timed, "time/checkpoint_write"),
        "run_s": time.perf_counter() - started,
        "records": [
            {
                key: record[key]
                for key in ("step", "time/step", "time/checkpoint", "time/checkpoint_write")
                if key in record
            }
            for record in timed
        ],
    }


def table(legs: list[dict]) -> str:
    def cell(values: list[float]) -> str:
        return f"{statistics.median(values) * 1000:.0f} ms" if values else "-"

    pooled: dict[int, list[dict]] = {}
    for leg in legs:
        pooled.setdefault(leg["interval"], []).extend(leg["records"])
    steps = {interval: [r["time/step"] for r in records] for interval, records in pooled.items()}
    base = statistics.median(steps[max(steps)])
    lines = [
        "| interval | steps timed | median step | ratio to interval "
        f"{max(steps)} | median checkpoint stall | median background write |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for interval, records in sorted(pooled.items()):
        step = statistics.median(steps[interval])
        stall = [r["time/checkpoint"] for r in records if "time/checkpoint" in r]
        write = [r["time/checkpoint_write"] for r in records if "time/checkpoint_write" in r]
        lines.append(
            f"| {interval} | {len(records)} | {step:.3f} s | **{step / base:.3f}** | {cell(stall)} | {cell(write)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--intervals", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--example", type=Path, default=REPO / "examples" / "tiny.yaml", help="the job to run")
    parser.add_argument("--shape", default="tiny", help="the random model's shape (grpojob tiny-model --shape)")
    parser.add_argument("--lora-rank", type=int, default=0, help="train a LoRA adapter of this rank (0: every weight)")
    parser.add_argument("--eager", action="store_true", help="no compiled decoder layers (a shorter first step)")
    args = parser.parse_args()

    from grpojob_trainer.environments.dataset import write_rows
    from grpojob_trainer.models.tiny import SHAPES, write_tiny_model

    example = yaml.safe_load(args.example.read_text())
    rows = example["spec"]["grpo"]["promptsPerStep"] * (args.steps + 1)
    with tempfile.TemporaryDirectory(prefix="checkpoint-interval-") as tmp:
        root = Path(tmp)
        model = write_tiny_model(root / "model", SHAPES[args.shape])
        data = write_rows("arithmetic", rows, root / "train.jsonl")
        legs = []
        for index in range(args.repeats):
            for interval in args.intervals:
                leg = run_leg(root, example, args, model, data, interval, index)
                print(json.dumps(leg), flush=True)
                legs.append(leg)
    print(table(legs))
    if args.json is not None:
        args.json.write_text(json.dumps(legs, indent=2) + "\n")


if __name__ == "__main__":
    main()
