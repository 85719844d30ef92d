"""The trainer reports progress with its pod's ServiceAccount, which may touch its config's ConfigMap
and nothing else (the Role the operator creates for it), against the real API server."""

from __future__ import annotations

import base64
import logging
import ssl
from pathlib import Path

import httpx
import pytest
import yaml
from kubernetes import client

from grpojob_api import v1alpha1 as api
from grpojob_api.admission import parse_job
from grpojob_api.progress import EvaluationReport, StoppedReport, StopReport
from grpojob_operator.children.trainer import CONFIG_FILE, build_config_map, build_trainer_rbac, render_job_config
from grpojob_trainer.observability.progress import ConfigMapProgressPublisher

pytestmark = pytest.mark.integration


def cluster_endpoint(kubeconfig: Path, tmp_path: Path) -> tuple[str, str]:
    """(server URL, CA file) of the kubeconfig's current cluster."""
    config = yaml.safe_load(kubeconfig.read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
    cluster = next(c for c in config["clusters"] if c["name"] == context["cluster"])["cluster"]
    if "certificate-authority-data" in cluster:
        ca = tmp_path / "ca.crt"
        ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
        return cluster["server"], str(ca)
    return cluster["server"], cluster["certificate-authority"]


def without_owner(manifest: dict) -> dict:
    manifest["metadata"].pop("ownerReferences")
    return manifest


def test_trainer_publishes_progress_and_can_touch_nothing_else(api_client, kubeconfig, namespace, tmp_path, caplog):
    job = parse_job(
        {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "metadata": {"name": "demo", "namespace": namespace, "uid": "00000000-0000-4000-8000-000000000000"},
            "spec": {"model": {"path": "/m"}, "dataset": {"path": "d.jsonl"}, "environments": [{"name": "e"}]},
        }
    )
    core, rbac = client.CoreV1Api(api_client), client.RbacAuthorizationV1Api(api_client)
    core.create_namespaced_config_map(namespace, without_owner(build_config_map(job)))
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "someone-else"}, "data": {"a": "1"}})
    account, role, binding = (without_owner(m) for m in build_trainer_rbac(job))
    core.create_namespaced_service_account(namespace, account)
    rbac.create_namespaced_role(namespace, role)
    rbac.create_namespaced_role_binding(namespace, binding)
    token = core.create_namespaced_service_account_token(
        "demo-trainer", namespace, {"spec": {"expirationSeconds": 600}}
    ).status.token
    server, ca = cluster_endpoint(kubeconfig, tmp_path)

    publisher = ConfigMapProgressPublisher(server, token, ca, namespace, "demo-config")

    def report() -> dict[str, str]:
        """What the trainer reported, beside its config, which stays as the operator wrote it."""
        data = core.read_namespaced_config_map("demo-config", namespace).data
        assert data[CONFIG_FILE] == render_job_config(job)
        return {key: value for key, value in data.items() if key != CONFIG_FILE}

    publisher.publish(5, 0.75)
    assert report() == {"step": "5", "meanReward": "0.75"}
    publisher.publish(6, float("nan"))  # no reward this step: the old one must not linger beside it
    assert report() == {"step": "6"}
    publisher.publish_output_model("models/demo/final", 6)
    publisher.publish(7, 0.5)  # the exported model's report stays beside later steps
    expected = {"step": "7", "meanReward": "0.5", "outputModel": "models/demo/final", "outputModelStep": "6"}
    assert report() == expected
    publisher.publish_evaluation(EvaluationReport(0, 0.25), None)  # the baseline: no best yet
    assert report() == expected | {"lastEvaluation": "0 0.25"}
    publisher.publish_evaluation(EvaluationReport(8, 0.5), EvaluationReport(8, 0.5))
    publisher.publish(9, 0.625)  # the evaluations' report stays beside later steps
    evaluated = {"lastEvaluation": "8 0.5", "bestEvaluation": "8 0.5"}
    assert report() == expected | evaluated | {
        "step": "9",
        "meanReward": "0.625",
    }

    # Once it has written a checkpoint, each step's report carries what a stop needs, in the same patch.
    publisher.publish(10, 0.625, StopReport(185, 48.2, 21.5, 14920384512))
    measured = {
        "meanReward": "0.625",
        "stopSeconds": "185",
        "checkpointWriteSeconds": "48.2",
        "trainingSeconds": "21.5",
    }
    assert report() == expected | evaluated | measured | {"step": "10", "checkpointBytes": "14920384512"}
    publisher.publish(11, 0.625, StopReport(185, 48.2, 21.5))  # a size it could not read: the old one goes
    assert report() == expected | evaluated | measured | {"step": "11"}

    # An attempt stopped early leaves its line, which outlives a deleted pod's termination message.
    publisher.publish_stopped(StoppedReport(2, "preempted at step 11; checkpoint /checkpoints/demo/step_00000011"))
    stopped = {"stopped": "2 preempted at step 11; checkpoint /checkpoints/demo/step_00000011"}
    assert report() == expected | evaluated | measured | {"step": "11"} | stopped

    # Reporting is best effort: a refused report is logged, it does not end training (nor change anything).
    with caplog.at_level(logging.WARNING, logger="grpojob_trainer.observability.progress"):
        ConfigMapProgressPublisher(server, token, ca, namespace, "someone-else").publish(8, 0.5)
    assert "could not report progress of step 8" in caplog.text and "403" in caplog.text
    assert core.read_namespaced_config_map("someone-else", namespace).data == {"a": "1"}

    verify = ssl.create_default_context(cafile=ca)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/merge-patch+json"}
    other = f"{server}/api/v1/namespaces/{namespace}/configmaps/someone-else"
    assert httpx.patch(other, json={"data": {"a": "2"}}, headers=headers, verify=verify).status_code == 403
    listing = f"{server}/api/v1/namespaces/{namespace}/configmaps"
    assert httpx.get(listing, headers=headers, verify=verify).status_code == 403
    assert (
        httpx.get(f"{server}/api/v1/namespaces/{namespace}/secrets", headers=headers, verify=verify).status_code == 403
    )
