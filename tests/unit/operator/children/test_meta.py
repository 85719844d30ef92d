"""Every child belongs to its job: owned by it as its controller, labelled with its name and uid."""

from __future__ import annotations

from grpojob_operator.children.endpoints import build_endpoints
from grpojob_operator.children.environments import build_environment_deployment, build_environment_service
from grpojob_operator.children.network import build_network_policy
from grpojob_operator.children.raycluster import build_generation_service, build_raycluster
from grpojob_operator.children.trainer import build_config_map, build_trainer_job, build_trainer_rbac

from .jobs import SETTINGS, job


def test_every_child_is_owned_by_the_job_as_its_controller():
    j = job()
    children = [
        build_raycluster(j, SETTINGS),
        build_config_map(j),
        build_generation_service(j),
        build_network_policy(j),
        build_endpoints(j, SETTINGS, "10.0.0.7", 1),
        build_environment_deployment(j, j.spec.environments[0], SETTINGS, 1),
        build_environment_service(j, j.spec.environments[0]),
        build_trainer_job(j, SETTINGS, 1),
        *build_trainer_rbac(j),
    ]
    for child in children:
        (owner,) = child["metadata"]["ownerReferences"]
        assert owner["kind"] == "GRPOJob" and owner["uid"] == j.metadata.uid and owner["controller"] is True
        assert child["metadata"]["namespace"] == "team-a"
        assert child["metadata"]["labels"]["grpo.dev/job"] == "demo"
    assert [c["metadata"]["name"] for c in children] == [
        "demo",
        "demo-config",
        "demo-generation",
        "demo-network",
        "demo-endpoints",
        "demo-env-math",
        "demo-env-math",
        "demo-trainer",
        "demo-trainer",
        "demo-trainer",
        "demo-trainer",
    ]


def test_every_pod_carries_the_job_uid_so_leftovers_of_a_same_named_job_are_not_adopted():
    j = job()
    cluster = build_raycluster(j, SETTINGS)["spec"]
    templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    templates.append(build_trainer_job(j, SETTINGS, 1)["spec"]["template"])
    templates.append(build_environment_deployment(j, j.spec.environments[0], SETTINGS, 1)["spec"]["template"])
    for template in templates:
        assert template["metadata"]["labels"]["grpo.dev/job-uid"] == j.metadata.uid
