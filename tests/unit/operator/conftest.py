from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from grpojob_api import v1alpha1 as api
from grpojob_operator.children.trainer import build_config_map
from grpojob_operator.observe import ConfigMapInfo, OtherInfo, PodInfo, RayClusterInfo

JOB_SPEC: dict[str, Any] = {
    "model": {"path": "/models/qwen", "servedModelName": "policy"},
    "dataset": {"configMap": {"name": "rows"}},
    "environments": [{"name": "math", "command": ["python", "-m", "grpojob_trainer.environments", "arithmetic"]}],
    "generation": {"replicas": 2, "gpusPerReplica": 1},
    "training": {"replicas": 1, "gpusPerReplica": 4},
    "backoffLimit": 1,
}


def job_body(name: str = "demo", spec: dict[str, Any] | None = None, status: dict[str, Any] | None = None) -> dict:
    """A GRPOJob as the API server returns it."""
    body = {
        "apiVersion": "grpo.dev/v1alpha1",
        "kind": "GRPOJob",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": "0f1e2d3c-0000-4000-8000-000000000001",
            "generation": 1,
            "creationTimestamp": "2026-11-30T10:00:00Z",
        },
        "spec": copy.deepcopy(spec if spec is not None else JOB_SPEC),
    }
    if status is not None:
        body["status"] = status
    return body


@pytest.fixture
def body() -> dict:
    return job_body()


def children_up_to_the_head(job: api.GRPOJob, head: PodInfo, head_ready: bool = True) -> dict:
    """The observed children of job ``demo`` before `<demo>-endpoints` is written: the NetworkPolicy, the
    RayCluster, its config ConfigMap, the generation Service, the trainer's RBAC, the head pod
    ``head`` (made not Ready unless ``head_ready``) and the Ray workers, each on a node."""
    if not head_ready:
        head = dataclasses.replace(head, ready=False)
    workers = {
        f"demo-{group}-worker-{index}": dataclasses.replace(
            head, name=f"demo-{group}-worker-{index}", component=group, ip=f"10.0.1.{index + 1}"
        )
        for group, replicas in (("generation", job.spec.generation.replicas), ("policy", job.spec.training.replicas))
        for index in range(replicas)
    }
    return {
        "NetworkPolicy": {"demo-network": OtherInfo("demo-network", False)},
        "RayCluster": {"demo": RayClusterInfo("demo", False)},
        "ConfigMap": {
            "demo-config": ConfigMapInfo("demo-config", tuple(build_config_map(job)["data"].items())),
        },
        "Service": {"demo-generation": OtherInfo("demo-generation", False)},
        "ServiceAccount": {"demo-trainer": OtherInfo("demo-trainer", False)},
        "Role": {"demo-trainer": OtherInfo("demo-trainer", False)},
        "RoleBinding": {"demo-trainer": OtherInfo("demo-trainer", False)},
        "Pod": {"demo-head": head, **workers},
    }
