"""A model named by its Hugging Face id: the download step (`grpojob download-model`, `huggingface_hub`'s own
`snapshot_download`) resolves it in a hub cache to one commit, whose snapshot directory every pod then loads
offline. No network here: the cache is filled on disk by `huggingface_hub`'s own layout functions
(`grpojob cache-model`), and the download runs with ``HF_HUB_OFFLINE=1``, as `spec.model.offline` runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpojob_api import paths
from grpojob_trainer.models.hub import place_in_cache
from grpojob_trainer.models.tiny import write_tiny_model

MODEL_ID = "grpojob-tests/tiny-chat"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


def grpojob(*args: str) -> subprocess.CompletedProcess[str]:
    """The `grpojob` command in offline mode, as the download pod of an offline job runs it."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("HF_TOKEN", None)
    return subprocess.run(
        [sys.executable, "-m", "grpojob_trainer.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_the_download_step_resolves_a_cached_model_id_to_one_commit(model_dir, tmp_path):
    cache = tmp_path / "hub"
    placed = place_in_cache(model_dir, MODEL_ID, cache)
    log = tmp_path / "termination-log"

    done = grpojob("download-model", MODEL_ID, "--cache", str(cache), "--termination-log", str(log))

    assert done.returncode == 0, done.stderr
    report = json.loads(log.read_text())
    assert report["commit"] == placed.commit
    assert Path(report["path"]) == cache / paths.hub_snapshot_path(MODEL_ID, placed.commit)
    snapshot = cache / paths.hub_snapshot_path(MODEL_ID, report["commit"])
    model = AutoModelForCausalLM.from_pretrained(snapshot, local_files_only=True)
    assert model.num_parameters() == AutoModelForCausalLM.from_pretrained(model_dir).num_parameters()
    assert (
        AutoTokenizer.from_pretrained(snapshot).chat_template == AutoTokenizer.from_pretrained(model_dir).chat_template
    )


def test_every_revision_resolves_to_its_own_commit(model_dir, tmp_path):
    cache = tmp_path / "hub"
    main = place_in_cache(model_dir, MODEL_ID, cache)
    other_dir = write_tiny_model(tmp_path / "other")
    tagged = place_in_cache(other_dir, MODEL_ID, cache, revision="v1")
    (other_dir / "README.md").write_text("a different revision\n")
    changed = place_in_cache(other_dir, MODEL_ID, cache, revision="v2")

    reports = {}
    for revision in ("main", "v1", "v2", changed.commit):
        done = grpojob("download-model", MODEL_ID, "--revision", revision, "--cache", str(cache))
        assert done.returncode == 0, done.stderr
        reports[revision] = json.loads(done.stdout)["commit"]

    assert reports == {"main": main.commit, "v1": tagged.commit, "v2": changed.commit, changed.commit: changed.commit}
    assert changed.commit != main.commit


def test_an_id_the_cache_does_not_hold_fails_with_a_reason(model_dir, tmp_path):
    cache = tmp_path / "hub"
    place_in_cache(model_dir, MODEL_ID, cache)
    log = tmp_path / "termination-log"

    unknown = grpojob("download-model", "nobody/no-such-model", "--cache", str(cache), "--termination-log", str(log))
    missing_revision = grpojob("download-model", MODEL_ID, "--revision", "v9", "--cache", str(cache))

    assert unknown.returncode == 1
    report = json.loads(log.read_text())
    assert report["reason"] == "ModelNotInCache"
    assert "nobody/no-such-model" in report["message"] and "spec.model.offline" in report["message"]
    assert missing_revision.returncode == 1 and "'v9'" in json.loads(missing_revision.stdout)["message"]


def test_transformers_loads_the_id_itself_from_the_cache_offline(model_dir, tmp_path):
    cache = tmp_path / "hub"
    place_in_cache(model_dir, MODEL_ID, cache)
    code = (
        "import sys; from transformers import AutoModelForCausalLM;"
        f"AutoModelForCausalLM.from_pretrained({MODEL_ID!r}, cache_dir={str(cache)!r}); print('loaded')"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and "loaded" in done.stdout, done.stderr
