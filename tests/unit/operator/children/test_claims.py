"""The claims as the pods mount them: one volume per claim, checkpoints and logs where they belong."""

from __future__ import annotations

from grpojob_operator.children.claims import CHECKPOINT_MOUNT, DATASET_MOUNT, LOG_MOUNT, MODEL_MOUNT
from grpojob_operator.children.raycluster import build_raycluster
from grpojob_operator.children.trainer import build_trainer_job

from .jobs import SETTINGS, env_of, job


def test_checkpoints_live_where_the_policy_actor_writes_them():
    j = job(checkpointing={"pvc": {"claimName": "ckpt"}, "interval": 5})
    cluster = build_raycluster(j, SETTINGS)["spec"]
    policy = next(g for g in cluster["workerGroupSpecs"] if g["groupName"] == "policy")["template"]["spec"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt", "readOnly": False}} in policy[
        "volumes"
    ]
    trainer_env = build_trainer_job(j, SETTINGS, 1)["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "GRPOJOB_CHECKPOINT_DIR", "value": "/data/checkpoints/checkpoints/demo"} in trainer_env


def test_a_claim_shared_by_model_dataset_and_checkpoints_is_one_volume_per_pod():
    # The kubelet mounts a claim once per pod: a second volume of it never mounts (found on the real node).
    claim = {"claimName": "grpo-data"}
    j = job(
        model={"path": "tiny-model", "pvc": claim},
        dataset={"path": "train.jsonl", "pvc": claim},
        checkpointing={"pvc": claim, "path": "checkpoints"},
    )
    trainer = build_trainer_job(j, SETTINGS, 1)["spec"]["template"]["spec"]
    policy = next(g for g in build_raycluster(j, SETTINGS)["spec"]["workerGroupSpecs"] if g["groupName"] == "policy")[
        "template"
    ]["spec"]
    # Both write to it: the policy its checkpoints, the trainer its logs (beside the checkpoints by default).
    for pod in (trainer, policy):
        claims = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
        assert [v["persistentVolumeClaim"] for v in claims] == [{"claimName": "grpo-data", "readOnly": False}]
        names = {v["name"] for v in pod["volumes"]}
        assert {m["name"] for m in pod["containers"][0]["volumeMounts"]} <= names
    mounts = {m["mountPath"]: m for m in trainer["containers"][0]["volumeMounts"]}
    assert mounts[MODEL_MOUNT]["readOnly"] and mounts[DATASET_MOUNT]["readOnly"]
    assert not mounts[LOG_MOUNT]["readOnly"]


def test_the_trainer_writes_each_attempts_logs_beside_the_checkpoints_on_their_claim():
    j = job(checkpointing={"pvc": {"claimName": "runs", "path": "team"}})
    (container,) = build_trainer_job(j, SETTINGS, 2)["spec"]["template"]["spec"]["containers"]
    env = env_of(container)
    assert env["GRPOJOB_LOG_DIR"]["value"] == f"{LOG_MOUNT}/logs/demo/attempt-2"
    assert env["GRPOJOB_CHECKPOINT_DIR"]["value"] == f"{CHECKPOINT_MOUNT}/checkpoints/demo"
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == LOG_MOUNT]
    assert mount["subPath"] == "team" and not mount["readOnly"]


def test_logs_go_to_their_own_claim_and_path_and_without_a_claim_stay_in_the_pod():
    j = job(logging={"pvc": {"claimName": "logs"}, "path": "grpo/demo"})
    pod = build_trainer_job(j, SETTINGS, 1)["spec"]["template"]["spec"]
    assert {"name": "logs", "persistentVolumeClaim": {"claimName": "logs", "readOnly": False}} in pod["volumes"]
    env = env_of(pod["containers"][0])
    assert env["GRPOJOB_LOG_DIR"]["value"] == f"{LOG_MOUNT}/grpo/demo/attempt-1"
    (container,) = build_trainer_job(job(), SETTINGS, 1)["spec"]["template"]["spec"]["containers"]
    assert env_of(container)["GRPOJOB_LOG_DIR"]["value"] == "/tmp/logs/demo/attempt-1"


def test_the_evaluation_rows_are_mounted_read_only_beside_the_training_rows_and_named_to_the_trainer():
    from grpojob_operator.children.claims import EVALUATION_DATASET_MOUNT

    j = job(
        dataset={"path": "train.jsonl", "pvc": {"claimName": "grpo-data"}},
        evaluation={"dataset": {"configMap": {"name": "held-out", "key": "test.jsonl"}}, "everySteps": 5},
    )
    pod = build_trainer_job(j, SETTINGS, 1)["spec"]["template"]["spec"]
    (container,) = pod["containers"]

    assert {"name": "evaluation-dataset", "configMap": {"name": "held-out"}} in pod["volumes"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts[EVALUATION_DATASET_MOUNT]["readOnly"] and mounts[DATASET_MOUNT]["readOnly"]
    env = env_of(container)
    assert env["GRPOJOB_EVALUATION_DATASET_PATH"]["value"] == f"{EVALUATION_DATASET_MOUNT}/test.jsonl"
    assert "GRPOJOB_EVALUATION_DATASET_PATH" not in env_of(
        build_trainer_job(job(), SETTINGS, 1)["spec"]["template"]["spec"]["containers"][0]
    )
