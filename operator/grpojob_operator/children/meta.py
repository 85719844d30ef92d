"""Object metadata every child carries: its name and namespace, the labels that tie it to the job, and the
owner reference that makes it the job's (and deleted with it)."""

from __future__ import annotations

from typing import Any

from grpojob_api import v1alpha1 as api
from grpojob_operator import names
from grpojob_operator.settings import OperatorSettings

Manifest = dict[str, Any]


def job_ref(job: api.GRPOJob) -> tuple[str, str]:
    """The job's name and namespace (a job read from the API always has one)."""
    if not job.metadata.namespace:
        raise ValueError("the GRPOJob has no namespace")
    return job.metadata.name, job.metadata.namespace


def owner_reference(job: api.GRPOJob) -> dict[str, Any]:
    """The controller owner reference that makes a child belong to (and be deleted with) the job."""
    if not job.metadata.uid:
        raise ValueError("the GRPOJob has no uid (build children from the object read from the API)")
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "name": job.metadata.name,
        "uid": job.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def labels(job: api.GRPOJob, component: str) -> dict[str, str]:
    """The labels of one component's objects and pods (`names.job_labels`)."""
    owner = owner_reference(job)
    return names.job_labels(owner["name"], owner["uid"], component)


def metadata(job: api.GRPOJob, name: str, component: str, extra_labels: dict[str, str] | None = None) -> Manifest:
    """A child's metadata: ``name`` in the job's namespace, the component's labels, the owner reference."""
    _, namespace = job_ref(job)
    return {
        "name": name,
        "namespace": namespace,
        "labels": {**labels(job, component), **(extra_labels or {})},
        "ownerReferences": [owner_reference(job)],
    }


def service_dns(service: str, namespace: str, settings: OperatorSettings) -> str:
    """The cluster DNS name of a Service."""
    return f"{service}.{namespace}.svc.{settings.cluster_domain}"
