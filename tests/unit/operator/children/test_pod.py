"""The hardened pod: each role's scheduling reaches its pods and only its pods; every container leaves the
reason it failed in its termination message."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from grpojob_api import v1alpha1 as api
from grpojob_api.admission import parse_job
from grpojob_operator.children.environments import build_environment_deployment
from grpojob_operator.children.pod import scheduled
from grpojob_operator.children.raycluster import build_raycluster
from grpojob_operator.children.trainer import build_trainer_job
from grpojob_operator.settings import OperatorSettings

from ..test_golden_children import all_jobs, render_children
from .jobs import SETTINGS, job


def test_each_roles_scheduling_reaches_its_pods_and_only_its_pods():
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    zone = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}
    scheduling = {
        "head": {"nodeSelector": {"pool": "cpu"}, "priorityClassName": "system-head"},
        "generation": {
            "nodeSelector": {"pool": "gen"},
            "tolerations": [gpu],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": zone}},
        },
        "policy": {"nodeSelector": {"pool": "train"}, "schedulerName": "gang", "labels": {"team": "rl"}},
        "environments": {"annotations": {"note": "env"}, "tolerations": [{"key": "spot", "value": "yes"}]},
        "trainer": {"priorityClassName": "trainer-high", "labels": {"team": "rl"}},
    }
    j = job(scheduling=scheduling)
    cluster = build_raycluster(j, SETTINGS)["spec"]
    head = cluster["headGroupSpec"]["template"]
    groups = {g["groupName"]: g["template"] for g in cluster["workerGroupSpecs"]}
    trainer = build_trainer_job(j, SETTINGS, 1)["spec"]["template"]
    environment = build_environment_deployment(j, j.spec.environments[0], SETTINGS, 1)["spec"]["template"]

    assert head["spec"]["nodeSelector"] == {"pool": "cpu"} and head["spec"]["priorityClassName"] == "system-head"
    assert groups["generation"]["spec"]["nodeSelector"] == {"pool": "gen"}
    assert groups["generation"]["spec"]["tolerations"] == [gpu]
    assert groups["generation"]["spec"]["affinity"] == {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": zone}
    }
    assert groups["policy"]["spec"]["schedulerName"] == "gang"
    assert groups["policy"]["metadata"]["labels"]["team"] == "rl"
    assert groups["policy"]["metadata"]["labels"]["grpo.dev/component"] == "policy"  # the operator's labels stay
    assert environment["metadata"]["annotations"] == {"note": "env"}
    assert environment["spec"]["tolerations"] == [{"key": "spot", "value": "yes"}]
    assert trainer["spec"]["priorityClassName"] == "trainer-high" and trainer["metadata"]["labels"]["team"] == "rl"
    # Nothing leaks to another role.
    assert "nodeSelector" not in trainer["spec"] and "tolerations" not in head["spec"]
    assert "affinity" not in groups["policy"]["spec"] and "priorityClassName" not in environment["spec"]


def test_without_scheduling_the_pod_templates_are_unchanged():
    plain = job()
    template = build_trainer_job(plain, SETTINGS, 1)["spec"]["template"]
    assert scheduled(template, api.PodScheduling()) == template
    assert (
        not {"nodeSelector", "tolerations", "affinity", "priorityClassName", "schedulerName"} & template["spec"].keys()
    )


def containers(manifest: Any) -> Iterator[dict[str, Any]]:
    """Every container (and init container) of every pod template anywhere in ``manifest``."""
    if isinstance(manifest, dict):
        for key, value in manifest.items():
            if key in ("containers", "initContainers"):
                yield from value
            else:
                yield from containers(value)
    elif isinstance(manifest, list):
        for item in manifest:
            yield from containers(item)


def test_every_container_of_every_example_jobs_children_reports_its_failure_in_its_termination_message():
    seen = set()
    for name, body in all_jobs().items():
        for child in render_children(parse_job(body), OperatorSettings()):
            if child["kind"] == "Workload":  # Kueue's copy of the pod sets' requests: it starts no container
                continue
            for container in containers(child):
                seen.add(container["name"])
                assert container.get("terminationMessagePolicy") == "FallbackToLogsOnError", (name, child["kind"])
    # The trainer, the Ray pods (KubeRay copies their templates), both kinds of environment pods, the
    # model download and TensorBoard.
    assert {"trainer", "ray-head", "ray-worker", "environment", "nemo-gym", "download", "tensorboard"} <= seen
