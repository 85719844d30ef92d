"""An environment's Deployment and Service."""

from __future__ import annotations

import json

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


def test_a_reward_file_from_a_config_map_is_mounted_read_only_and_named_in_the_servers_config():
    rewards = {
        "path": "examples/rewards/gsm8k.py",
        "configMap": {"name": "gsm8k-rewards"},
        "functions": [{"name": "accuracy"}, {"builtin": "format", "weight": 0.5}],
        "timeoutSeconds": 5,
    }
    j = job(environments=[{"name": "gsm8k", "rewards": rewards}])
    pod = build_environment_deployment(j, j.spec.environments[0], SETTINGS, 1)["spec"]["template"]["spec"]
    [container] = pod["containers"]

    assert container["command"] == ["python", "-m", "grpojob_trainer.environments", "rewards"]
    assert container["image"] == SETTINGS.environment_image
    config = json.loads(next(v["value"] for v in container["env"] if v["name"] == "GRPOJOB_REWARDS"))
    assert config == {
        "file": "/etc/grpojob-rewards/gsm8k.py",
        "functions": [{"name": "accuracy", "weight": 1.0}, {"builtin": "format", "weight": 0.5}],
        "timeoutSeconds": 5.0,
        "workers": 2,
        "sandbox": {"cpuSeconds": 10, "memoryMb": 512},
    }
    only_the_file = [{"key": "gsm8k.py", "path": "gsm8k.py"}]
    assert {"name": "reward-file", "configMap": {"name": "gsm8k-rewards", "items": only_the_file}} in pod["volumes"]
    assert {"name": "reward-file", "mountPath": "/etc/grpojob-rewards", "readOnly": True} in container["volumeMounts"]


def test_a_reward_file_on_a_claim_is_read_inside_its_mount():
    rewards = {"path": "code/rewards.py", "pvc": {"claimName": "data", "path": "team"}, "functions": [{"name": "f"}]}
    j = job(environments=[{"name": "coder", "rewards": rewards}])
    pod = build_environment_deployment(j, j.spec.environments[0], SETTINGS, 1)["spec"]["template"]["spec"]
    [container] = pod["containers"]

    config = json.loads(next(v["value"] for v in container["env"] if v["name"] == "GRPOJOB_REWARDS"))
    assert config["file"] == "/etc/grpojob-rewards/claim/code/rewards.py"
    assert {"name": "reward-file", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}} in pod["volumes"]
    mount = {"name": "reward-file", "mountPath": "/etc/grpojob-rewards/claim", "readOnly": True, "subPath": "team"}
    assert mount in container["volumeMounts"]
