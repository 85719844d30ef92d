"""TensorBoard's Deployment and Service."""

from __future__ import annotations

from grpojob_operator.children.claims import LOG_MOUNT
from grpojob_operator.children.tensorboard import build_tensorboard_deployment, build_tensorboard_service
from grpojob_operator.children.trainer import build_trainer_job

from .jobs import SETTINGS, job


def test_tensorboard_reads_every_attempt_of_the_job_read_only_behind_its_own_service():
    j = job(logging={"pvc": {"claimName": "logs", "path": "team"}, "tensorboard": True})
    deployment = build_tensorboard_deployment(j, SETTINGS)
    service = build_tensorboard_service(j)
    assert deployment["metadata"]["name"] == service["metadata"]["name"] == "demo-tensorboard"
    assert deployment["metadata"]["ownerReferences"][0]["uid"] == j.metadata.uid
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "example/ray:1"  # the trainer image has TensorBoard
    assert f"--logdir={LOG_MOUNT}/logs/demo" in container["command"]
    (claim,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claim["persistentVolumeClaim"] == {"claimName": "logs", "readOnly": True}
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == claim["name"]]
    assert mount["readOnly"] and mount["subPath"] == "team"
    assert container["securityContext"]["readOnlyRootFilesystem"] and not pod["automountServiceAccountToken"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    trainer_labels = build_trainer_job(j, SETTINGS, 1)["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= trainer_labels.items()
    assert service["spec"]["ports"] == [{"name": "http", "port": 6006, "targetPort": 6006}]


def test_tensorboard_is_placed_as_the_trainer_the_jobs_other_cpu_pod():
    rule = {"nodeSelector": {"pool": "cpu"}, "priorityClassName": "batch", "labels": {"team": "rl"}}
    j = job(logging={"pvc": {"claimName": "logs"}, "tensorboard": True}, scheduling={"trainer": rule})
    template = build_tensorboard_deployment(j, SETTINGS)["spec"]["template"]
    assert template["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert template["spec"]["priorityClassName"] == "batch"
    assert template["metadata"]["labels"]["team"] == "rl"
