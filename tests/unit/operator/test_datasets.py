"""Datasets as the operator arranges them: a dataset named by its Hugging Face id is downloaded by the job's one
download Job (beside a hub model, into the same cache claim) before anything starts, its commit kept in
`status.datasetCommits`, and the trainer told where that commit's snapshot is in the cache it mounts read-only;
several sources are each mounted and named to the trainer in their order."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from grpojob_api import v1alpha1 as api
from grpojob_api.admission import parse_job
from grpojob_api.endpoints import TrainerEnv
from grpojob_api.hub import HubRepo
from grpojob_operator.children.claims import DATASET_MOUNT, HUB_CACHE_MOUNT
from grpojob_operator.children.model import build_model_download_job
from grpojob_operator.children.trainer import build_trainer_job
from grpojob_operator.observe import Observed, OtherInfo, PodInfo, TrainerJobInfo
from grpojob_operator.plan import plan as plan_job
from grpojob_operator.plan.actions import Create, Delete, Plan
from grpojob_operator.plan.conditions import condition
from grpojob_operator.settings import OperatorSettings

from .conftest import JOB_SPEC, job_body

NOW = datetime(2026, 11, 30, 10, 0, 10, tzinfo=UTC)
SETTINGS = OperatorSettings(ray_image="example/ray:1", pod_failure_grace_seconds=60)
MODEL_COMMIT, DATASET_COMMIT, HELD_OUT_COMMIT = "a" * 40, "b" * 40, "c" * 40
MAPPING = {"promptField": "question", "environment": "math", "fields": {"expected_answer": "answer"}}
HUB_DATASET = {"id": "org/arith", "split": "train", "config": "main", "tokenSecret": {"name": "hf-data", "key": "t"}}
SNAPSHOT = f"{HUB_CACHE_MOUNT}/datasets--org--arith/snapshots/{DATASET_COMMIT}"


def body(**spec) -> dict:
    return job_body(spec={**JOB_SPEC, "dataset": {**HUB_DATASET, "mapping": MAPPING}, **spec})


def plan(manifest: dict, children: dict) -> Plan:
    return plan_job(manifest, Observed(children), SETTINGS, NOW)


def created(result: Plan) -> list[tuple[str, str]]:
    return [(a.manifest["kind"], a.manifest["metadata"]["name"]) for a in result.actions if isinstance(a, Create)]


def download_pod(report: dict | None = None, **kw) -> PodInfo:
    fields = dict(phase="Succeeded", ready=False, ip=None, deleting=False, created=NOW - timedelta(seconds=5))
    fields.update(kw)
    message = json.dumps(report) if report is not None else ""
    return PodInfo("demo-model-x", "model-download", None, ready_since=None, termination_message=message, **fields)


def downloaded(report: dict | None, complete: bool = True, failed: bool = False, **pod) -> dict:
    """The children of a job whose download Job has ended with ``report``."""
    return {
        "NetworkPolicy": {"demo-network": OtherInfo("demo-network", False)},
        "PersistentVolumeClaim": {"demo-model-cache": OtherInfo("demo-model-cache", False)},
        "Job": {"demo-model": TrainerJobInfo("demo-model", 0, complete, failed, "", False)},
        "Pod": {"demo-model-x": download_pod(report, **pod)},
    }


def container_env(manifest: dict) -> dict[str, dict]:
    return {e["name"]: e for e in manifest["spec"]["template"]["spec"]["containers"][0]["env"]}


def trainer_env(manifest: dict) -> TrainerEnv:
    return TrainerEnv.from_env({name: e["value"] for name, e in container_env(manifest).items() if "value" in e})


def test_a_dataset_named_by_id_is_downloaded_into_the_jobs_cache_before_anything_starts():
    result = plan(body(), {})

    network, claim = ("NetworkPolicy", "demo-network"), ("PersistentVolumeClaim", "demo-model-cache")
    assert created(result) == [network, claim, ("Job", "demo-model")]
    ready = condition(result.status, api.ConditionType.DATASET_READY)
    assert ready is not None and ready.status == "False" and ready.reason == "Downloading"
    assert "org/arith at revision main" in ready.message
    assert condition(result.status, api.ConditionType.MODEL_READY) is None  # the model is a path

    job = build_model_download_job(parse_job(body()), SETTINGS)
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["grpojob", "download"]
    repos = [HubRepo.parse(argument) for argument in command if argument.startswith("{")]
    assert repos == [HubRepo(kind="dataset", id="org/arith", token_env="HF_TOKEN_1", field="spec.dataset")]
    env = container_env(job)
    assert env["HF_TOKEN_1"]["valueFrom"] == {"secretKeyRef": {"name": "hf-data", "key": "t"}}
    assert env["HF_HUB_CACHE"]["value"] == HUB_CACHE_MOUNT and "HF_HUB_OFFLINE" not in env


def test_the_commit_the_download_resolved_reaches_the_status_and_the_trainer_reads_its_snapshot():
    result = plan(body(), downloaded({"commits": [DATASET_COMMIT]}))

    assert result.status.dataset_commits == {"org/arith@main": DATASET_COMMIT}
    ready = condition(result.status, api.ConditionType.DATASET_READY)
    assert ready is not None and ready.status == "True" and DATASET_COMMIT in ready.message
    assert ("RayCluster", "demo") in created(result)

    trainer = build_trainer_job(parse_job(body()), SETTINGS, 1, None, result.status.dataset_commits)
    assert trainer_env(trainer).dataset_paths == [SNAPSHOT]
    template = trainer["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in template["volumes"]}
    assert volumes["hub-cache"]["persistentVolumeClaim"] == {"claimName": "demo-model-cache", "readOnly": True}
    mounts = {m["name"]: m for m in template["containers"][0]["volumeMounts"]}
    assert mounts["hub-cache"] == {"name": "hub-cache", "mountPath": HUB_CACHE_MOUNT, "readOnly": True}
    assert container_env(trainer)["HF_HUB_OFFLINE"]["value"] == "1"
    known = {**body(), "status": {"datasetCommits": result.status.dataset_commits}}
    assert ("Job", "demo-model") not in created(plan(known, {})), "a known commit is not downloaded again"


def test_a_hub_model_and_hub_datasets_share_one_download_job_and_one_cache():
    model = {"id": "Qwen/Qwen2.5-0.5B", "tokenSecret": {"name": "hf-data", "key": "t"}, "cache": {"claimName": "hf"}}
    evaluation = {"dataset": {"id": "org/held-out", "split": "test", "revision": "v1", "offline": True}}
    manifest = body(model=model, evaluation=evaluation)
    job = build_model_download_job(parse_job(manifest), SETTINGS)
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    repos = [HubRepo.parse(argument) for argument in command if argument.startswith("{")]
    assert [(r.kind, r.id, r.revision, r.token_env, r.offline) for r in repos] == [
        ("model", "Qwen/Qwen2.5-0.5B", "main", "HF_TOKEN", False),
        ("dataset", "org/arith", "main", "HF_TOKEN", False),  # the model's Secret: one token
        ("dataset", "org/held-out", "v1", None, True),
    ]
    assert [e["name"] for e in container_env(job).values() if "valueFrom" in e] == ["HF_TOKEN"]
    assert job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "hf"

    children = downloaded({"commits": [MODEL_COMMIT, DATASET_COMMIT, HELD_OUT_COMMIT]})
    del children["PersistentVolumeClaim"]
    status = plan(manifest, children).status
    assert status.model_commit == MODEL_COMMIT
    assert status.dataset_commits == {"org/arith@main": DATASET_COMMIT, "org/held-out@v1": HELD_OUT_COMMIT}

    trainer = build_trainer_job(parse_job(manifest), SETTINGS, 1, status.model_commit, status.dataset_commits)
    env = trainer_env(trainer)
    assert env.dataset_paths == [SNAPSHOT.replace("demo-model-cache", "hf")]
    assert env.evaluation_dataset_path == f"{HUB_CACHE_MOUNT}/datasets--org--held-out/snapshots/{HELD_OUT_COMMIT}"
    cache_mounts = [m for m in trainer["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]]
    assert [m["mountPath"] for m in cache_mounts].count(HUB_CACHE_MOUNT) == 1


def test_a_report_without_every_commit_is_downloaded_again_and_a_failure_fails_the_job_with_its_reason():
    evaluation = {"dataset": {"id": "org/held-out", "split": "test"}}
    short = plan(body(evaluation=evaluation), downloaded({"commits": [DATASET_COMMIT]}))
    assert [type(a) for a in short.actions] == [Delete] and short.status.dataset_commits is None

    report = {"reason": "DatasetNotFound", "message": "no dataset 'org/arith' on the Hugging Face hub"}
    failed = plan(body(), downloaded(report, complete=False, failed=True, phase="Failed"))
    assert failed.status.phase == "Failed" and failed.status.reason == "DatasetNotFound"
    assert "org/arith" in (failed.status.message or "")


def test_several_sources_are_each_mounted_and_named_to_the_trainer_in_their_order():
    sources = [
        {"path": "a.jsonl", "pvc": {"claimName": "data", "path": "rows"}, "weight": 3},
        {"path": "b.jsonl", "pvc": {"claimName": "data", "path": "rows"}},
        {"configMap": {"name": "extra", "key": "rows.jsonl"}, "weight": 0.5},
        {**HUB_DATASET, "mapping": MAPPING},
    ]
    manifest = job_body(spec={**JOB_SPEC, "dataset": {"sources": sources}})
    trainer = build_trainer_job(parse_job(manifest), SETTINGS, 1, None, {"org/arith@main": DATASET_COMMIT})

    assert trainer_env(trainer).dataset_paths == [
        f"{DATASET_MOUNT}-0/a.jsonl",
        f"{DATASET_MOUNT}-1/b.jsonl",
        f"{DATASET_MOUNT}-2/rows.jsonl",
        SNAPSHOT,
    ]
    assert container_env(trainer)["GRPOJOB_DATASET_PATH"]["value"].startswith('["')  # a JSON list
    template = trainer["spec"]["template"]["spec"]
    claims = [v for v in template["volumes"] if v.get("persistentVolumeClaim", {}).get("claimName") == "data"]
    assert len(claims) == 1, "two sources on one claim: one volume (the kubelet mounts a claim once per pod)"
    mounts = {m["mountPath"]: m for m in template["containers"][0]["volumeMounts"]}
    assert mounts[f"{DATASET_MOUNT}-1"]["subPath"] == "rows" and mounts[f"{DATASET_MOUNT}-1"]["readOnly"]
    assert mounts[f"{DATASET_MOUNT}-2"]["name"] == "dataset-2"
    single = build_trainer_job(parse_job(job_body()), SETTINGS, 1)
    assert container_env(single)["GRPOJOB_DATASET_PATH"]["value"] == f"{DATASET_MOUNT}/train.jsonl"  # as before
