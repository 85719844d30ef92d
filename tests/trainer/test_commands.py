"""The documented commands, run as processes: write the tiny model and the rows, serve an environment (as its
pod runs it, configured by the variables of `grpojob_api.endpoints`) against the generation server, /run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from grpojob_api import endpoints
from grpojob_trainer.net.loopback import free_port, wait_until_healthy

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


def test_the_model_dataset_and_environment_commands_serve_a_run_end_to_end(tmp_path: Path, generation_server):
    model_dir = tmp_path / "model"
    subprocess.run([sys.executable, "-m", "grpojob_trainer.models.tiny", str(model_dir)], env=ENV, check=True)
    assert (model_dir / "config.json").exists() and (model_dir / "tokenizer_config.json").exists()
    rows_file = tmp_path / "rows.jsonl"
    subprocess.run(
        [sys.executable, "-m", "grpojob_trainer.environments.dataset", "arithmetic", "--rows", "3", "--out",
         str(rows_file)],
        env=ENV, check=True,
    )  # fmt: skip
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert len(rows) == 3

    env_port = free_port()
    environment = ["-m", "grpojob_trainer.environments", "arithmetic", "--host", "127.0.0.1"]
    env_vars = {**ENV, endpoints.PORT: str(env_port), endpoints.POLICY_BASE_URL: generation_server.base_url}
    with process(environment, f"http://127.0.0.1:{env_port}/", env=env_vars):
        row = rows[0]
        row["responses_create_params"] |= {"temperature": 1.0, "top_p": 1.0}
        result = httpx.post(f"http://127.0.0.1:{env_port}/run", json=row, timeout=60).json()

    assert result["response"]["model"] == generation_server.config.served_model_name
    assert result["response"]["output"][-1]["generation_token_ids"]
    assert 0.0 <= result["reward"] <= 1.0
