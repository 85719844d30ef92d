"""Models in and out, as the operator arranges them: a Hugging Face id is downloaded once by a Job of its own
into a cache claim before any Ray pod starts, every pod then loads the one commit the download resolved with
the hub switched off; the exported model's claim is mounted where the policy writes it, and its place is
reported in `status.outputModel`."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from grpojob_api import v1alpha1 as api
from grpojob_api.admission import parse_job
from grpojob_api.hub import HubRepo
from grpojob_operator.children.claims import HUB_CACHE_MOUNT, OUTPUT_MOUNT, model_cache_claim, model_path, output_claim
from grpojob_operator.children.model import build_model_cache_claim, build_model_download_job
from grpojob_operator.children.raycluster import build_raycluster
from grpojob_operator.children.trainer import build_trainer_job
from grpojob_operator.observe import ConfigMapInfo, Observed, OtherInfo, PodInfo, TrainerJobInfo
from grpojob_operator.plan import plan as plan_job
from grpojob_operator.plan.actions import Create, Delete, Plan
from grpojob_operator.plan.conditions import condition
from grpojob_operator.settings import OperatorSettings

from .conftest import JOB_SPEC, job_body

NOW = datetime(2026, 11, 30, 10, 0, 10, tzinfo=UTC)
SETTINGS = OperatorSettings(ray_image="example/ray:1", pod_failure_grace_seconds=60)
COMMIT = "a" * 40
HUB_MODEL = {"id": "Qwen/Qwen2.5-0.5B-Instruct", "revision": "v2", "tokenSecret": {"name": "hf", "key": "token"}}


def hub_body(model: dict | None = None, **spec) -> dict:
    return job_body(spec={**JOB_SPEC, "model": model or HUB_MODEL, **spec})


def download_pod(message: str = "", **kw) -> PodInfo:
    fields = dict(phase="Succeeded", ready=False, ip=None, deleting=False, created=NOW - timedelta(seconds=5))
    fields.update(kw)
    return PodInfo(
        name="demo-model-abcde",
        component="model-download",
        attempt=None,
        ready_since=None,
        termination_message=message,
        **fields,
    )


def download_job(complete: bool = False, failed: bool = False) -> TrainerJobInfo:
    return TrainerJobInfo("demo-model", 0, complete, failed, "BackoffLimitExceeded" if failed else "", False)


def plan(body: dict, children: dict) -> Plan:
    return plan_job(body, Observed(children), SETTINGS, NOW)


def created(result: Plan) -> list[tuple[str, str]]:
    return [(a.manifest["kind"], a.manifest["metadata"]["name"]) for a in result.actions if isinstance(a, Create)]


def model_ready(result: Plan) -> api.Condition:
    found = condition(result.status, api.ConditionType.MODEL_READY)
    assert found is not None
    return found


def test_a_hub_model_is_downloaded_before_anything_that_loads_it_starts():
    result = plan(hub_body(), {})

    network = ("NetworkPolicy", "demo-network")  # first: before any pod of the job, the download's included
    assert created(result) == [network, ("PersistentVolumeClaim", "demo-model-cache"), ("Job", "demo-model")]
    assert result.status.phase == "Initializing"
    assert model_ready(result).status == "False" and model_ready(result).reason == "Downloading"
    assert "Qwen/Qwen2.5-0.5B-Instruct at revision v2" in model_ready(result).message


def test_a_cache_claim_the_spec_names_is_used_not_created():
    body = hub_body({**HUB_MODEL, "cache": {"claimName": "shared-hf"}})
    result = plan(body, {})

    assert created(result) == [("NetworkPolicy", "demo-network"), ("Job", "demo-model")]
    (download,) = [a.manifest for a in result.actions if a.manifest["kind"] == "Job"]
    assert download["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "shared-hf"


def test_the_download_job_runs_huggingface_hub_with_the_token_of_the_named_secret():
    job = parse_job(hub_body())
    download = build_model_download_job(job, SETTINGS)
    (container,) = download["spec"]["template"]["spec"]["containers"]

    assert container["command"][:2] == ["grpojob", "download"]
    (argument,) = [a for a in container["command"] if a.startswith("{")]
    assert HubRepo.parse(argument) == HubRepo(
        kind="model", id="Qwen/Qwen2.5-0.5B-Instruct", revision="v2", token_env="HF_TOKEN", field="spec.model"
    )
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert env["HF_HUB_CACHE"]["value"] == HUB_CACHE_MOUNT
    assert "HF_HUB_OFFLINE" not in env
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert download["spec"]["backoffLimit"] == 0
    placed = hub_body(scheduling={"trainer": {"nodeSelector": {"pool": "cpu"}}})
    template = build_model_download_job(parse_job(placed), SETTINGS)["spec"]["template"]
    assert template["spec"]["nodeSelector"] == {"pool": "cpu"}  # placed as the trainer pod is
    offline = build_model_download_job(parse_job(hub_body({"id": "org/m", "offline": True})), SETTINGS)
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in offline["spec"]["template"]["spec"]["containers"][0]["env"]


def test_the_claim_the_job_creates_has_the_size_and_class_of_the_spec():
    body = hub_body(
        {"id": "org/m", "cache": {"size": "200Gi", "storageClassName": "fast", "accessMode": "ReadWriteMany"}}
    )
    claim = build_model_cache_claim(parse_job(body))

    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "200Gi"}},
        "storageClassName": "fast",
    }
    assert claim["metadata"]["ownerReferences"][0]["kind"] == "GRPOJob"


def test_while_the_download_runs_nothing_else_is_created():
    children = {
        "NetworkPolicy": {"demo-network": OtherInfo("demo-network", False)},
        "PersistentVolumeClaim": {"demo-model-cache": OtherInfo("demo-model-cache", False)},
        "Job": {"demo-model": download_job()},
        "Pod": {"demo-model-abcde": download_pod(phase="Running")},
    }
    result = plan(hub_body(), children)

    assert result.actions == []
    assert model_ready(result).reason == "Downloading"


def test_the_commit_the_download_resolved_is_the_one_every_pod_loads():
    report = json.dumps({"commits": [COMMIT]})
    children = {
        "PersistentVolumeClaim": {"demo-model-cache": OtherInfo("demo-model-cache", False)},
        "Job": {"demo-model": download_job(complete=True)},
        "Pod": {"demo-model-abcde": download_pod(report)},
    }
    result = plan(hub_body(), children)

    assert result.status.model_commit == COMMIT
    assert model_ready(result).status == "True" and COMMIT in model_ready(result).message
    assert ("RayCluster", "demo") in created(result)

    job = parse_job(hub_body())
    trainer = build_trainer_job(job, SETTINGS, 1, result.status.model_commit)
    env = {e["name"]: e.get("value") for e in trainer["spec"]["template"]["spec"]["containers"][0]["env"]}
    snapshot = f"/data/hf-cache/models--Qwen--Qwen2.5-0.5B-Instruct/snapshots/{COMMIT}"
    assert env["GRPOJOB_MODEL_PATH"] == snapshot
    with pytest.raises(ValueError, match="no commit yet"):
        build_trainer_job(job, SETTINGS, 1)


def test_a_finished_download_whose_pod_the_cache_still_shows_running_is_waited_for_not_repeated():
    children = {
        "NetworkPolicy": {"demo-network": OtherInfo("demo-network", False)},
        "PersistentVolumeClaim": {"demo-model-cache": OtherInfo("demo-model-cache", False)},
        "Job": {"demo-model": download_job(complete=True)},
        "Pod": {"demo-model-abcde": download_pod(phase="Running")},
    }
    assert plan(hub_body(), children).actions == []

    del children["Pod"]  # the pod, and its report, are gone: the download runs again
    assert [type(a) for a in plan(hub_body(), children).actions] == [Delete]


def test_every_pod_that_loads_the_model_has_the_hub_off_and_the_cache_read_only():
    job = parse_job(hub_body())
    cluster = build_raycluster(job, SETTINGS)
    trainer = build_trainer_job(job, SETTINGS, 1, COMMIT)
    templates = [cluster["spec"]["headGroupSpec"]["template"], trainer["spec"]["template"]]
    templates += [group["template"] for group in cluster["spec"]["workerGroupSpecs"]]
    for template in templates:
        (container,) = template["spec"]["containers"]
        assert {"name": "HF_HUB_OFFLINE", "value": "1"} in container["env"], container["name"]
    for template in templates[1:]:
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "demo-model-cache", "readOnly": True}
        mounts = {m["name"]: m for m in template["spec"]["containers"][0]["volumeMounts"]}
        assert mounts["model"] == {"name": "model", "mountPath": HUB_CACHE_MOUNT, "readOnly": True}


@pytest.mark.parametrize(
    ("report", "reason", "says"),
    [
        (
            {"reason": "ModelNotFound", "message": "no model 'org/nope' on the Hugging Face hub"},
            "ModelNotFound",
            "org/",
        ),
        ({"reason": "ModelAccessDenied", "message": "gated: set spec.model.tokenSecret"}, "ModelAccessDenied", "token"),
        ({}, "ModelDownloadFailed", "BackoffLimitExceeded"),
    ],
)
def test_a_failed_download_fails_the_job_with_its_reason(report, reason, says):
    children = {
        "Job": {"demo-model": download_job(failed=True)},
        "Pod": {"demo-model-abcde": download_pod(json.dumps(report) if report else "", phase="Failed")},
    }
    result = plan(hub_body(), children)

    assert result.status.phase == "Failed" and result.status.reason == reason
    assert says in (result.status.message or "")
    assert ("RayCluster", "demo") not in created(result)


def test_a_missing_token_secret_fails_the_job_at_once():
    stuck = download_pod(
        phase="Pending",
        stuck=(("download", "CreateContainerConfigError", 'secret "hf" not found'),),
        created=NOW - timedelta(seconds=1),
    )
    result = plan(hub_body(), {"Job": {"demo-model": download_job()}, "Pod": {"demo-model-abcde": stuck}})

    assert result.status.phase == "Failed" and result.status.reason == "ModelDownloadFailed"
    assert 'secret "hf" not found' in (result.status.message or "")


def test_a_path_model_needs_no_download():
    result = plan(job_body(), {})
    assert ("Job", "demo-model") not in created(result)
    assert condition(result.status, api.ConditionType.MODEL_READY) is None


def test_the_exported_model_goes_to_the_output_claim_on_the_policy_workers():
    body = job_body(spec={**JOB_SPEC, "output": {"pvc": {"claimName": "models", "path": "team"}, "path": "out/demo"}})
    job = parse_job(body)
    cluster = build_raycluster(job, SETTINGS)
    policy = next(g for g in cluster["spec"]["workerGroupSpecs"] if g["groupName"] == "policy")
    mounts = {m["name"]: m for m in policy["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["output"] == {"name": "output", "mountPath": OUTPUT_MOUNT, "subPath": "team"}
    trainer = build_trainer_job(job, SETTINGS, 1)
    env = {e["name"]: e.get("value") for e in trainer["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GRPOJOB_OUTPUT_DIR"] == f"{OUTPUT_MOUNT}/out/demo"


def test_the_trainers_report_of_its_exported_model_becomes_status_output_model():
    spec = {**JOB_SPEC, "checkpointing": {"pvc": {"claimName": "ckpt", "path": "runs"}}}
    progress = {"step": "7", "meanReward": "0.5", "outputModel": "models/demo/final", "outputModelStep": "7"}
    children = {"ConfigMap": {"demo-config": ConfigMapInfo("demo-config", tuple(sorted(progress.items())))}}
    result = plan(job_body(spec=spec), children)

    assert result.status.output_model == api.OutputModelStatus(
        path="runs/models/demo/final", claim_name="ckpt", step=7, format=api.OutputFormat.MERGED
    )
    adapter_spec = {**spec, "training": {"lora": {"rank": 8}}, "output": {"format": "adapter"}}
    adapter = plan(job_body(spec=adapter_spec), children).status.output_model
    assert adapter is not None and adapter.format == api.OutputFormat.ADAPTER  # what a LoRA job wrote
    named = parse_job(
        job_body(spec={**spec, "model": {"path": "runs/models/demo/final", "pvc": {"claimName": "ckpt"}}})
    )
    assert model_path(named) == "/data/model/runs/models/demo/final"


def test_the_hub_example_names_its_model_by_id_and_exports_to_the_checkpoint_claim():
    from pathlib import Path

    from grpojob_trainer.commands.job import load_job

    job = load_job(Path(__file__).resolve().parents[3] / "examples" / "qwen2.5-1.5b-instruct-hub.yaml")
    assert job.spec.model.id == "Qwen/Qwen2.5-1.5B-Instruct" and model_cache_claim(job) == "hf-cache"
    assert output_claim(job) == job.spec.checkpointing.pvc and job.spec.output.every_checkpoint
