"""The NetworkPolicy."""

from __future__ import annotations

from grpojob_operator.children.environments import build_environment_deployment
from grpojob_operator.children.network import build_network_policy
from grpojob_operator.children.raycluster import build_raycluster
from grpojob_operator.children.trainer import build_trainer_job

from .jobs import SETTINGS, job


def test_the_network_policy_admits_only_the_jobs_own_pods_to_them():
    j = job()
    policy = build_network_policy(j)
    assert policy["metadata"]["name"] == "demo-network"
    own = {"grpo.dev/job": "demo", "grpo.dev/job-uid": j.metadata.uid}
    assert policy["spec"]["podSelector"] == {"matchLabels": own}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": own}}]},
        {"ports": [{"port": 9090}, {"port": 6006}]},  # Prometheus and TensorBoard readers, from anywhere
    ]
    # Every pod of the job is selected (and so may reach the others): they all carry both labels.
    cluster = build_raycluster(j, SETTINGS)["spec"]
    templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    templates.append(build_trainer_job(j, SETTINGS, 1)["spec"]["template"])
    templates.append(build_environment_deployment(j, j.spec.environments[0], SETTINGS, 1)["spec"]["template"])
    for template in templates:
        assert own.items() <= template["metadata"]["labels"].items()
