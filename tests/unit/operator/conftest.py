from __future__ import annotations

import copy
from typing import Any

import pytest

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
