"""The documented commands, run as processes: write the tiny model, serve it, serve an environment, /run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from grpojob_trainer.net import free_port, wait_until_healthy

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@contextmanager
def process(args: list[str], ready_url: str, env: dict[str, str] | None = None) -> Iterator[None]:
    proc = subprocess.Popen([sys.executable, *args], env=env or ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def running() -> None:
        if proc.poll() is not None:
            raise AssertionError(f"{args} exited: {proc.stdout.read().decode()[-2000:]}")

    try:
        wait_until_healthy(ready_url, 60, check=running)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_model_server_and_environment_commands_serve_a_run_end_to_end(tmp_path: Path):
    model_dir = tmp_path / "model"
    subprocess.run([sys.executable, "-m", "grpojob_trainer.tiny_model", str(model_dir)], env=ENV, check=True)
    rows_file = tmp_path / "rows.jsonl"
    subprocess.run(
        [sys.executable, "-m", "grpojob_trainer.environments.dataset", "arithmetic", "--rows", "3", "--out",
         str(rows_file)],
        env=ENV, check=True,
    )  # fmt: skip
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert len(rows) == 3

    model_port, env_port = free_port(), free_port()
    generation = [
        "-m", "grpojob_trainer.generation.server", "--model", str(model_dir), "--served-model-name", "tiny",
        "--host", "127.0.0.1", "--port", str(model_port), "--temperature", "1.0", "--top-p", "1.0",
        "--max-new-tokens", "8",
    ]  # fmt: skip
    environment = ["-m", "grpojob_trainer.environments", "arithmetic", "--host", "127.0.0.1"]
    env_vars = {**ENV, "PORT": str(env_port), "POLICY_BASE_URL": f"http://127.0.0.1:{model_port}/v1"}
    with (
        process(generation, f"http://127.0.0.1:{model_port}/health"),
        process(environment, f"http://127.0.0.1:{env_port}/", env=env_vars),
    ):
        row = rows[0]
        row["responses_create_params"] |= {"temperature": 1.0, "top_p": 1.0}
        result = httpx.post(f"http://127.0.0.1:{env_port}/run", json=row, timeout=60).json()

    assert result["response"]["model"] == "tiny"
    assert len(result["response"]["output"][-1]["generation_token_ids"]) <= 8
    assert 0.0 <= result["reward"] <= 1.0
