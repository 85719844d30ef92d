"""The model stage on its own: a path needs nothing; a hub id is downloaded before anything else goes on.
(The download's report, failures and the cache claim, through whole passes: tests/unit/operator/test_models.py.)"""

from __future__ import annotations

from grpojob_api import v1alpha1 as api
from grpojob_operator.plan.context import GO_ON, STOP
from grpojob_operator.plan.model import model

from ..conftest import job_body
from .conftest import kinds_and_names, one_pass


def hub_body(**status) -> dict:
    body = job_body(status=status or None)
    body["spec"]["model"] = {"id": "Qwen/Qwen2.5-0.5B", "servedModelName": "policy"}
    return body


def test_a_path_model_goes_on_at_once():
    pass_ = one_pass(job_body(), {})
    assert model(pass_) is GO_ON and pass_.plan.actions == []


def test_a_hub_model_starts_its_download_and_stops_the_pass():
    pass_ = one_pass(hub_body(), {})
    assert model(pass_) is STOP
    assert kinds_and_names(pass_.plan) == [
        ("Create", "PersistentVolumeClaim", "demo-model-cache"),
        ("Create", "Job", "demo-model"),
    ]
    assert pass_.status.phase == api.Phase.INITIALIZING


def test_a_hub_model_whose_commit_is_known_goes_on():
    pass_ = one_pass(hub_body(modelCommit="abc123"), {})
    assert model(pass_) is GO_ON and pass_.plan.actions == []


def test_the_download_job_goes_where_kueue_placed_the_job():
    pass_ = one_pass(hub_body(), {})
    pass_.place = lambda manifest: {**manifest, "placed": True}
    model(pass_)
    (download,) = [a.manifest for a in pass_.plan.actions if a.manifest["kind"] == "Job"]
    assert download.get("placed"), "Kueue counts the download's pod (pod set model-download): it is placed"


def test_datasets_named_by_id_are_downloaded_too_and_the_pass_goes_on_once_every_commit_is_known():
    body = hub_body(modelCommit="abc123")
    body["spec"]["dataset"] = {"id": "org/rows", "split": "train"}
    pass_ = one_pass(body, {})
    assert model(pass_) is STOP, "the model's commit alone is not enough"
    assert ("Create", "Job", "demo-model") in kinds_and_names(pass_.plan)

    body["status"]["datasetCommits"] = {"org/rows@main": "def456"}
    pass_ = one_pass(body, {})
    assert model(pass_) is GO_ON and pass_.plan.actions == []
