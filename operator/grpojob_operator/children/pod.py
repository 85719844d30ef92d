"""The one pod every child's pods are built from: non-root with the runtime's seccomp profile, no Kubernetes
API token unless it runs as a ServiceAccount, containers that drop every capability, write only to their
volumes and leave the reason they failed in their termination message, and the scheduling of its role
(`spec.scheduling.<role>`)."""

from __future__ import annotations

from typing import Any

from grpojob_api import v1alpha1 as api
from grpojob_operator.children.meta import Manifest

NON_ROOT_UID = 1000


def pod_security_context() -> Manifest:
    """Every pod runs as the images' non-root user, with the runtime's default seccomp profile."""
    return {
        "runAsNonRoot": True,
        "runAsUser": NON_ROOT_UID,
        "runAsGroup": NON_ROOT_UID,
        "fsGroup": NON_ROOT_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> Manifest:
    """No privilege escalation, no capabilities."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def read_only_container_security_context() -> Manifest:
    """A container that writes only to its volumes (every image keeps HOME and caches under /tmp)."""
    return {**container_security_context(), "readOnlyRootFilesystem": True}


def container(name: str, image: str, **fields: Any) -> Manifest:
    """A container of the job: ``fields`` as given, with a read-only root filesystem and no privileges. Its
    termination message is what it wrote to /dev/termination-log or, when it failed without writing one,
    the end of its log: the reason it died reaches the pod's status, where the operator reads it."""
    return {
        "name": name,
        "image": image,
        **fields,
        "securityContext": read_only_container_security_context(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def scheduled(template: Manifest, scheduling: api.PodScheduling) -> Manifest:
    """A pod template with one role's scheduling (`spec.scheduling.<role>`) applied: node selector,
    tolerations, affinity, priority class, scheduler, and extra labels and annotations under the
    template's own (the operator's labels win)."""
    metadata = dict(template.get("metadata", {}))
    spec = dict(template["spec"])
    if scheduling.labels:
        metadata["labels"] = {**scheduling.labels, **metadata.get("labels", {})}
    if scheduling.annotations:
        metadata["annotations"] = {**scheduling.annotations, **metadata.get("annotations", {})}
    if scheduling.node_selector:
        spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **scheduling.node_selector}
    if scheduling.tolerations:
        own = [t.model_dump(by_alias=True, exclude_defaults=True) for t in scheduling.tolerations]
        spec["tolerations"] = [*spec.get("tolerations", []), *own]
    if scheduling.affinity is not None and scheduling.affinity.to_pod():
        spec["affinity"] = scheduling.affinity.to_pod()
    if scheduling.priority_class_name:
        spec["priorityClassName"] = scheduling.priority_class_name
    if scheduling.scheduler_name:
        spec["schedulerName"] = scheduling.scheduler_name
    return {**template, "metadata": metadata, "spec": spec}


def hardened_pod(
    labels: dict[str, str],
    containers: list[Manifest],
    volumes: list[Manifest],
    scheduling: api.PodScheduling,
    *,
    annotations: dict[str, str] | None = None,
    service_account: str | None = None,
    run_once: bool = False,
) -> Manifest:
    """A pod template of the job, with ``scheduling`` applied: non-root, and without a Kubernetes API token
    unless it runs as ``service_account``; ``run_once`` pods are never restarted (a Job's)."""
    metadata: Manifest = {"labels": labels}
    if annotations:
        metadata["annotations"] = annotations
    spec: Manifest = {"securityContext": pod_security_context()}
    if service_account:
        spec["serviceAccountName"] = service_account
    else:
        spec["automountServiceAccountToken"] = False
    if run_once:
        spec["restartPolicy"] = "Never"
    spec |= {"containers": containers, "volumes": volumes}
    return scheduled({"metadata": metadata, "spec": spec}, scheduling)


def run_once_job(metadata: Manifest, template: Manifest) -> Manifest:
    """A batch/v1 Job whose one pod (``template``, a `hardened_pod(run_once=True)`) runs once: never
    retried, the operator decides what follows a failure."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {"backoffLimit": 0, "template": template},
    }
