"""`grpojob run` refuses a dataset it cannot read with one line naming `spec.dataset.path` (exit 2), before it
starts anything: an empty path (which the API refuses too) and a path that is a directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpojob_api import v1alpha1 as api
from grpojob_trainer import cli


def job_file(tmp_path: Path, dataset_path: str) -> Path:
    """A GRPOJob file for `grpojob run` whose model directory exists and whose dataset is ``dataset_path``."""
    model = tmp_path / "model"
    model.mkdir()
    manifest = {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": "demo"},
        "spec": {
            "model": {"path": str(model)},
            "dataset": {"path": dataset_path},
            "environments": [{"name": "arith", "command": ["python", "-m", "env"]}],
            "generation": {"gpusPerReplica": 0, "maxModelLen": 256, "maxNewTokens": 8},
            "training": {"gpusPerReplica": 0},
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(manifest))
    return path


def refusal(job: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """What `grpojob run JOB` prints when it exits 2; it prints nothing else."""
    assert cli.main(["run", str(job), "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.splitlines()) == 1, captured.err
    return captured.err


def test_an_empty_dataset_path_is_refused_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    err = refusal(job_file(tmp_path, ""), capsys)
    assert err.startswith("grpojob: ") and "invalid GRPOJob: spec.dataset.path: " in err


def test_a_dataset_path_that_is_a_directory_is_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    rows = tmp_path / "rows"
    rows.mkdir()
    err = refusal(job_file(tmp_path, str(rows)), capsys)
    assert (
        err == f"grpojob: spec.dataset.path: {rows} is not a file (write one with `grpojob dataset NAME --out FILE`)\n"
    )


@pytest.mark.parametrize(
    ("evaluation_path", "named"),
    [
        ("directory", "spec.evaluation.dataset.path: {path} is not a file"),
        ("missing.jsonl", "spec.evaluation.dataset.path: {path} does not exist"),
        ("not-rows.jsonl", "spec.evaluation.dataset: {path}:1: not a NeMo Gym row"),
    ],
)
def test_an_evaluation_dataset_it_cannot_read_is_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], evaluation_path: str, named: str
):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"responses_create_params": {"input": "1+1="}, "expected_answer": "2"}) + "\n")
    held_out = tmp_path / evaluation_path
    if evaluation_path == "directory":
        held_out.mkdir()
    elif evaluation_path == "not-rows.jsonl":
        held_out.write_text('{"question": "1+1="}\n')
    job = job_file(tmp_path, str(rows))
    manifest = json.loads(job.read_text())
    manifest["spec"]["evaluation"] = {"dataset": {"path": str(held_out)}}
    job.write_text(json.dumps(manifest))

    err = refusal(job, capsys)

    assert err.startswith(f"grpojob: {named.format(path=held_out)}"), err


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"metadata": {"name": "demo", "labels": {"team": "rl team"}}}, "metadata.labels: value 'rl team' of 'team'"),
        ({"metadata": {"name": "demo", "labels": {"team": "x" * 64}}}, "metadata.labels: value 'xxx"),
        ({"metadata": {"name": "demo", "labels": {"a/b/c": "x"}}}, "metadata.labels: key 'a/b/c'"),
        ({"metadata": {"name": "demo", "annotations": {"-bad": "x"}}}, "metadata.annotations: key '-bad'"),
        ({"metadata": {"name": "demo", "lables": {"team": "rl"}}}, 'unknown field "metadata.lables"'),
        ({"apiVersion": None}, "apiVersion: required (apiVersion: grpo.dev/v1alpha1)"),
        ({"kind": None}, "kind: required (kind: GRPOJob)"),
    ],
    ids=["label-space", "label-64", "label-key", "annotation-key", "unknown-metadata", "no-apiVersion", "no-kind"],
)
def test_what_the_api_server_refuses_in_the_envelope_is_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict, named: str
):
    path = job_file(tmp_path, "rows.jsonl")
    manifest = {**json.loads(path.read_text()), **change}
    path.write_text(json.dumps({key: value for key, value in manifest.items() if value is not None}))

    err = refusal(path, capsys)

    assert err.startswith("grpojob: ") and named in err, err
