"""An environment's Deployment and Service."""

from __future__ import annotations

from grpojob_operator.children.environments import build_environment_deployment, build_environment_service

from .jobs import SETTINGS, job


def test_secrets_stay_secret_references():
    j = job(
        environments=[
            {"name": "judge", "env": [{"name": "JUDGE_KEY", "secretKeyRef": {"name": "judge", "key": "token"}}]}
        ]
    )
    container = build_environment_deployment(j, j.spec.environments[0], SETTINGS, 1)["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert {"name": "JUDGE_KEY", "valueFrom": {"secretKeyRef": {"name": "judge", "key": "token"}}} in container["env"]
    assert not any(var.get("value") for var in container["env"] if var["name"] == "JUDGE_KEY")


def test_the_environment_service_is_headless_over_its_ready_pods():
    j = job(environments=[{"name": "math", "replicas": 3, "port": 8080}])
    service = build_environment_service(j, j.spec.environments[0])["spec"]
    assert service["clusterIP"] == "None", "no cluster IP to allocate: the name resolves to each ready pod"
    assert service["publishNotReadyAddresses"] is False
    assert service["selector"] == {"grpo.dev/job": "demo", "grpo.dev/environment": "math"}
    assert service["ports"] == [{"name": "http", "port": 8080, "targetPort": 8080}]
