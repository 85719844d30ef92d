"""A dataset named by its Hugging Face id, without a network: `grpojob cache-dataset` puts a local dataset (parquet
files under configurations its card declares, a JSONL of NeMo Gym rows) into a hub cache in the hub's layout; the
download step (`grpojob download`) resolves it to its commit there, as an offline job's download pod does; and
`grpojob run` reads it from this machine's cache with `datasets`, offline (every socket refused), making its
plain columns into NeMo Gym rows through the source's mapping, drawn beside a local JSONL source by weight."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from grpojob_api import paths
from grpojob_api.hub import HubRepo
from grpojob_trainer import cli
from grpojob_trainer.commands.job import load_job
from grpojob_trainer.commands.local import local_data
from grpojob_trainer.environments.dataset import write_rows
from grpojob_trainer.errors import UsageError
from grpojob_trainer.training.data import MixedPromptDataset

DATASET_ID = "grpojob-tests/arithmetic-plain"
CARD = """---
configs:
- config_name: main
  default: true
  data_files:
  - split: train
    path: main/train-*.parquet
  - split: test
    path: main/test-*.parquet
- config_name: hard
  data_files:
  - split: train
    path: hard/train-*.parquet
---
# Arithmetic questions as plain columns
"""


def write_dataset(directory: Path) -> Path:
    """A hub dataset as its repository holds it: a card with two configurations of parquet files, and a JSONL
    of NeMo Gym rows (one with tools, one without: `datasets` gives both every key)."""
    for config, split, questions in [
        ("main", "train", [(a, b) for a in range(4) for b in range(3)]),
        ("main", "test", [(7, 1), (8, 1)]),
        ("hard", "train", [(40, 2)]),
    ]:
        (directory / config).mkdir(parents=True, exist_ok=True)
        table = pa.table(
            {
                "question": [f"What is {a}+{b}?" for a, b in questions],
                "answer": [str(a + b) for a, b in questions],
                "level": [config] * len(questions),
            }
        )
        pq.write_table(table, directory / config / f"{split}-00000-of-00001.parquet")
    gym = [
        {
            "responses_create_params": {"input": "What is 1+1?"},
            "agent_ref": {"name": "arithmetic"},
            "expected_answer": "2",
        },
        {
            "responses_create_params": {"input": "Weather?", "tools": [{"type": "function", "name": "get_weather"}]},
            "expected_answer": "sunny",
        },
    ]
    (directory / "gym.jsonl").write_text("".join(json.dumps(row) + "\n" for row in gym))
    (directory / "README.md").write_text(CARD)
    return directory


@pytest.fixture
def cache(tmp_path: Path) -> tuple[Path, str]:
    """A hub cache holding the dataset, filled by `grpojob cache-dataset`; and its commit."""
    hub = tmp_path / "hub"
    assert cli.main(["cache-dataset", str(write_dataset(tmp_path / "dataset")), DATASET_ID, "--cache", str(hub)]) == 0
    (commit,) = [p.name for p in (hub / f"datasets--{DATASET_ID.replace('/', '--')}" / "snapshots").iterdir()]
    return hub, commit


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, cache: tuple[Path, str]) -> Path:
    """This machine's hub cache is ``cache``, and no socket connects anywhere."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache[0]))

    def refuse(*_: object) -> None:
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    return cache[0]


def test_the_download_step_resolves_a_cached_dataset_to_its_commit(cache, tmp_path):
    hub, commit = cache
    log = tmp_path / "termination-log"
    repo = HubRepo(kind="dataset", id=DATASET_ID, revision="main", offline=True, field="spec.dataset.sources[0]")
    missing = HubRepo(kind="dataset", id="nobody/nothing", offline=True, field="spec.evaluation.dataset")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "grpojob_trainer.cli", "download", "--cache", str(hub)]

    done = subprocess.run([*command, "--termination-log", str(log), repo.argument()], env=env, text=True, timeout=300)
    assert done.returncode == 0
    assert json.loads(log.read_text()) == {"commits": [commit]}
    assert (hub / paths.hub_snapshot_path(DATASET_ID, commit, "dataset") / "main").is_dir()

    failed = subprocess.run([*command, repo.argument(), missing.argument()], env=env, capture_output=True, text=True)
    report = json.loads(failed.stdout.splitlines()[-1])
    assert failed.returncode == 1 and report["reason"] == "DatasetNotInCache"
    assert "nobody/nothing" in report["message"] and "spec.evaluation.dataset.offline" in report["message"]


def job(tmp_path: Path, dataset: dict, evaluation: dict | None = None) -> Path:
    spec = {
        "model": {"path": str(tmp_path)},
        "dataset": dataset,
        "environments": [{"name": "arithmetic", "command": ["python", "-m", "grpojob_trainer.environments"]}],
        "generation": {"maxModelLen": 256, "maxNewTokens": 8},
        "grpo": {"seed": 5},
    }
    if evaluation is not None:
        spec["evaluation"] = evaluation
    path = tmp_path / "job.yaml"
    path.write_text(
        yaml.safe_dump({"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "d"}, "spec": spec})
    )
    return path


MAPPING = {
    "promptField": "question",
    "systemPrompt": "Answer with the number only.",
    "environment": "arithmetic",
    "fields": {"expected_answer": "answer"},
}


def test_grpojob_run_reads_a_dataset_by_id_offline_through_its_mapping_beside_a_local_file(offline, tmp_path):
    local = write_rows("arithmetic", 8, tmp_path / "local.jsonl")
    hub_source = {"id": DATASET_ID, "config": "main", "split": "train", "mapping": MAPPING, "weight": 3}
    evaluation = {"dataset": {"id": DATASET_ID, "split": "test", "mapping": MAPPING}}
    spec = load_job(job(tmp_path, {"sources": [hub_source, {"path": str(local)}]}, evaluation)).spec

    prompts, held_out = local_data(spec)

    assert isinstance(prompts, MixedPromptDataset)
    drawn = [row for _ in range(20) for row in prompts.next_batch(8)]
    by_source = Counter("system" in json.dumps(row.model_dump()) for row in drawn)
    assert by_source[True] / len(drawn) == pytest.approx(0.75, abs=0.08)  # weights 3 : 1
    mapped = next(row for row in drawn if "system" in json.dumps(row.model_dump()))
    first, second = mapped.responses_create_params.input
    assert first == {"role": "system", "content": "Answer with the number only.", "type": "message"}
    assert second["role"] == "user" and second["content"].startswith("What is ")
    a, b = second["content"].removeprefix("What is ").removesuffix("?").split("+")
    assert mapped.task_fields()["expected_answer"] == str(int(a) + int(b))
    assert mapped.agent_ref is not None and mapped.agent_ref.name == "arithmetic"
    assert "level" not in mapped.task_fields(), "only the mapped fields"
    assert held_out is not None and [row.task_fields()["expected_answer"] for row in held_out] == ["8", "9"]


def test_a_configuration_files_and_rows_that_are_already_nemo_gym_rows(offline, tmp_path):
    hard = load_job(job(tmp_path, {"id": DATASET_ID, "config": "hard", "split": "train", "mapping": MAPPING}))
    (row,) = local_data(hard.spec)[0].next_batch(1)
    assert row.task_fields()["expected_answer"] == "42"

    gym = load_job(job(tmp_path, {"id": DATASET_ID, "split": "train", "files": ["gym.jsonl"]}))
    rows = local_data(gym.spec)[0].rows  # type: ignore[attr-defined]
    assert sorted(r.task_fields()["expected_answer"] for r in rows) == ["2", "sunny"]
    tools = next(r for r in rows if r.responses_create_params.tools)
    assert tools.responses_create_params.tools == [{"type": "function", "name": "get_weather"}]
    plain = next(r for r in rows if not r.responses_create_params.tools)
    assert plain.responses_create_params.parallel_tool_calls is True, "a key the row did not have is absent"


def test_grpojob_run_says_what_to_do_with_a_dataset_its_cache_lacks_or_rows_it_cannot_take(offline, tmp_path):
    missing = load_job(job(tmp_path, {"sources": [{"id": "nobody/nothing", "split": "train"}]}))
    with pytest.raises(UsageError, match=r"spec\.dataset\.sources\[0\]\.id: this machine's hub cache .* does not hold"):
        local_data(missing.spec)
    with pytest.raises(UsageError, match="grpojob cache-dataset DIR nobody/nothing"):
        local_data(missing.spec)

    unmapped = load_job(job(tmp_path, {"id": DATASET_ID, "split": "train"}))
    with pytest.raises(UsageError, match=r"spec\.dataset: row 0 of .*: not a NeMo Gym row \(give the source a mapping"):
        local_data(unmapped.spec)
    wrong_column = {**MAPPING, "promptField": "prompt"}
    wrong = load_job(job(tmp_path, {"id": DATASET_ID, "split": "train", "mapping": wrong_column}))
    with pytest.raises(UsageError, match=r"spec\.dataset\.mapping\.promptField: no column 'prompt'"):
        local_data(wrong.spec)
