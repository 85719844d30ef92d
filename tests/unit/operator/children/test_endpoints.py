"""`<job>-endpoints`: the addresses of the job's Services, read by the pods through envFrom."""

from __future__ import annotations

import json

from grpojob_operator.children.endpoints import build_endpoints
from grpojob_operator.children.environments import build_environment_deployment
from grpojob_operator.children.trainer import build_trainer_job

from .jobs import SETTINGS, job


def test_endpoints_are_the_addresses_of_the_jobs_services():
    data = build_endpoints(job(), SETTINGS, "10.0.0.7", 2)["data"]
    assert data == {
        "RAY_GCS_ADDRESS": "demo-head-svc.team-a.svc.cluster.example:6379",
        "RAY_HEAD_POD_IP": "10.0.0.7",
        "RAY_DASHBOARD_URL": "http://demo-head-svc.team-a.svc.cluster.example:8265",
        "POLICY_BASE_URL": "http://demo-generation.team-a.svc.cluster.example:8000/v1",
        "PENGUIN_ENV_URLS": json.dumps({"math": "http://demo-env-math.team-a.svc.cluster.example:8080"}),
        "GRPOJOB_NAME": "demo",
        "GRPOJOB_ATTEMPT": "2",
    }


def test_environment_and_trainer_read_the_endpoints_through_env_from():
    j = job()
    deployment = build_environment_deployment(j, j.spec.environments[0], SETTINGS, 1)
    trainer = build_trainer_job(j, SETTINGS, 3)
    for pod in (deployment["spec"]["template"]["spec"], trainer["spec"]["template"]["spec"]):
        assert pod["containers"][0]["envFrom"] == [{"configMapRef": {"name": "demo-endpoints"}}]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False
    assert trainer["metadata"]["labels"]["grpo.dev/attempt"] == "3"
    assert trainer["spec"]["template"]["metadata"]["labels"]["grpo.dev/attempt"] == "3"
    assert trainer["spec"]["backoffLimit"] == 0, "the operator, not the Job controller, counts attempts"
