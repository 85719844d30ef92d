"""CPU benchmark of the rollout path's own cost: rollouts through an environment server against an engine
that answers at once, so that only our HTTP hops and bookkeeping are timed.

    python benchmarks/rollout_path.py [--rollouts 256] [--repeats 3] [--environment-replicas 1]

Two legs, one process, the same generation server (our OpenAI-compatible app in front of an instant
engine that returns a fixed 256-token answer):

- anchor: every prompt sent straight to ``/v1/chat/completions`` (aiohttp, all in flight at once);
- ours: every row through the arithmetic environment's ``/run`` with `collect_rollouts`, as a GRPO step
  sends them: driver → ``/run`` → ``/seed_session`` → the policy → ``/verify``, in a separate process.

Prints the medians and their ratio (ours / anchor), and the CPU time the environment server spent per round (all
its processes, from ``/proc``: Linux) and this process (the driver and the generation server), which a busy machine
moves less than the wall-clock times. The model is the tiny one (`grpojob tiny-model`), written to a temporary
directory: only its tokenizer is used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grpojob_api import v1alpha1 as api
from grpojob_trainer.generation.app import ServerConfig
from grpojob_trainer.generation.backend import (
    ContinuousBatchingBackend,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)
from grpojob_trainer.generation.server import GenerationServer

ANSWER_TOKENS = 256


class InstantEngine(ContinuousBatchingBackend):
    """Answers every prompt at once with the same ``ANSWER_TOKENS`` tokens ("The answer is 42." repeated)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._max_model_len = 4096
        sentence = tuple(tokenizer("The answer is 42. ", add_special_tokens=False)["input_ids"])
        self.answer = (sentence * (ANSWER_TOKENS // len(sentence) + 1))[:ANSWER_TOKENS]

    async def generate_one(self, request: GenerationRequest, params: SamplingParams) -> GenerationResult:
        return self._answer()

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        return [self._answer() for _ in requests]

    def update_weights(self, named_tensors: Any) -> int:
        """Weights change nothing here; only the version moves, as in a real engine."""
        self._weights_version += 1
        return self._weights_version

    def _answer(self) -> GenerationResult:
        return GenerationResult(self.answer, (-1.0,) * len(self.answer), "length", self._weights_version)


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds of ``pids`` and every process below them (Linux's ``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, seen, todo = 0.0, set(), list(pids)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        todo += [int(child) for child in children]
    return total


async def direct_calls(base_url: str, rows: list[dict[str, Any]]) -> float:
    """Seconds to send every row's prompt straight to the policy, all at once."""
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:

        async def one(row: dict[str, Any]) -> None:
            params = row["responses_create_params"]
            body = {"model": "policy", "messages": params["input"], "max_tokens": 512, "temperature": 1.0, "top_p": 1.0}
            async with client.post(f"{base_url}/chat/completions", json=body) as response:
                response.raise_for_status()
                await response.json()

        started = time.perf_counter()
        await asyncio.gather(*(one(row) for row in rows))
        return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--environment-replicas", type=int, default=1, help="environment server processes")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from grpojob_trainer.environments.dataset import write_rows
    from grpojob_trainer.experience.rollouts import PolicySampling, collect_rollouts
    from grpojob_trainer.local.environment_processes import EnvironmentProcesses
    from grpojob_trainer.models.tiny import write_tiny_model

    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = AutoTokenizer.from_pretrained(write_tiny_model(Path(scratch) / "model"))
        data = write_rows("arithmetic", args.rollouts, Path(scratch) / "rows.jsonl")
        rows = [json.loads(line) for line in data.read_text().splitlines()]
        environment = api.EnvironmentSpec(
            name="arithmetic",
            command=["python", "-m", "grpojob_trainer.environments", "arithmetic"],
            replicas=args.environment_replicas,
        )
        config = ServerConfig("policy", SamplingParams(1.0, 1.0, 512))
        anchor, ours, cpu, own_cpu = [], [], [], []
        with GenerationServer(InstantEngine(tokenizer), config) as server:
            processes = EnvironmentProcesses(
                [environment],
                policy_base_urls=[server.base_url],
                policy_model_name="policy",
                gcs_address="",
                log_dir=Path(scratch) / "logs",
            )
            with processes as urls:
                sampling = PolicySampling(1.0, 1.0, 512)
                for _ in range(args.repeats + 1):  # the first round warms both paths up
                    anchor.append(asyncio.run(direct_calls(server.base_url, rows)))
                    pids = [process.pid for process in processes.processes.values()]
                    cpu_before, own_before, started = cpu_seconds(pids), time.process_time(), time.perf_counter()
                    batch = asyncio.run(
                        collect_rollouts(rows, urls, concurrency=len(rows), retries=0, sampling=sampling)
                    )
                    ours.append(time.perf_counter() - started)
                    cpu.append(cpu_seconds(pids) - cpu_before)
                    own_cpu.append(time.process_time() - own_before)
                    if batch.failures:
                        raise SystemExit(f"{len(batch.failures)} rollouts failed: {batch.failures[0].error}")
    ours_s, anchor_s = statistics.median(ours[1:]), statistics.median(anchor[1:])
    print(f"{args.rollouts} rollouts through the environment: {ours_s:.2f} s (median of {args.repeats})")
    print(f"{args.rollouts} direct policy calls (anchor):      {anchor_s:.2f} s")
    print(f"ours / anchor: {ours_s / anchor_s:.2f}")
    print(f"environment server CPU per round: {statistics.median(cpu[1:]):.2f} s")
    print(f"driver and generation server CPU per round: {statistics.median(own_cpu[1:]):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
