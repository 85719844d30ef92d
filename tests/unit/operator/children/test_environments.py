"""An environment's Deployment and Service."""

from __future__ import annotations

from grpojob_operator.children.environments import build_environment_deployment

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
