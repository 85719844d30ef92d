"""Kueue admission of a whole GRPOJob: the one Workload that stands for every pod of the job, and the
placement Kueue's admission gives its children. Pure: manifests in, manifests out.

A job labelled `kueue.x-k8s.io/queue-name` gets a Workload `<job>-workload` (owned by the job, in its
LocalQueue) whose pod sets are the Ray head, each Ray worker group, each environment, the trainer, a hub
model's download and TensorBoard, with their counts and requests. No child is created until Kueue admits
it; the admitted flavors' node labels and tolerations are then added to the matching children's pod
templates. The label itself is never copied onto a child: Kueue's RayCluster or Job integration would admit
that child a second time (kuberay#4064).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from grpojob_api import v1alpha1 as api
from grpojob_operator import kinds, names
from grpojob_operator.children.environments import build_environment_deployment
from grpojob_operator.children.meta import metadata
from grpojob_operator.children.model import build_model_download_job
from grpojob_operator.children.raycluster import build_raycluster
from grpojob_operator.children.tensorboard import build_tensorboard_deployment
from grpojob_operator.children.trainer import trainer_admission_template
from grpojob_operator.settings import OperatorSettings

GROUP = kinds.WORKLOAD.group
VERSION = kinds.WORKLOAD.version
API_VERSION = kinds.WORKLOAD.api_version
HEAD_POD_SET = "head"
TRAINER_POD_SET = "trainer"
MODEL_DOWNLOAD_POD_SET = "model-download"
TENSORBOARD_POD_SET = "tensorboard"
# The pod sets of the children that are neither the RayCluster nor an environment, by the component label of
# their pod template (`names.COMPONENT_LABEL`): each is one pod, its own pod set.
_POD_SET_OF_COMPONENT = {
    ("Job", "trainer"): TRAINER_POD_SET,
    ("Job", "model-download"): MODEL_DOWNLOAD_POD_SET,
    ("Deployment", "tensorboard"): TENSORBOARD_POD_SET,
}
_POD_SPEC_FIELDS = ("nodeSelector", "affinity", "tolerations", "priorityClassName", "runtimeClassName", "overhead")

Manifest = dict[str, Any]
Placement = tuple[dict[str, str], list[Manifest]]
"""Node labels to select and tolerations to add, for one pod set."""
Placer = Callable[[Manifest], Manifest]


def queue_name(job: api.GRPOJob) -> str | None:
    """The LocalQueue the job is to be admitted through, or None when Kueue does not manage it."""
    return job.metadata.labels.get(names.QUEUE_NAME_LABEL) or None


def priority_class(job: api.GRPOJob) -> str | None:
    """The job's WorkloadPriorityClass (label `kueue.x-k8s.io/priority-class`), if it names one."""
    return job.metadata.labels.get(names.PRIORITY_CLASS_LABEL) or None


def environment_pod_set(environment: str) -> str:
    return f"env-{environment}"


def _pod_set(name: str, count: int, template: Manifest) -> Manifest:
    """A pod set whose template keeps only what admission reads: requests and where the pods may go."""
    spec = template["spec"]
    containers = [
        {"name": c["name"], "image": c["image"], "resources": c.get("resources", {})} for c in spec["containers"]
    ]
    kept: Manifest = {key: spec[key] for key in _POD_SPEC_FIELDS if key in spec}
    return {"name": name, "count": count, "template": {"spec": {**kept, "containers": containers}}}


def pod_sets(job: api.GRPOJob, settings: OperatorSettings) -> list[Manifest]:
    """Every pod of the job as Kueue pod sets: the Ray head, each worker group, each environment, the
    trainer, a hub model's download (`spec.model.id`) and TensorBoard (`spec.logging.tensorboard`). A NeMo
    Gym environment is counted with its Deployment's requests and scheduling (its pods differ only in what
    they run). Built before anything runs: nothing here needs the model's commit or the Ray head."""
    cluster = build_raycluster(job, settings)["spec"]
    sets = [_pod_set(HEAD_POD_SET, 1, cluster["headGroupSpec"]["template"])]
    sets += [_pod_set(g["groupName"], g["replicas"], g["template"]) for g in cluster["workerGroupSpecs"]]
    for env in job.spec.environments:
        deployment = build_environment_deployment(job, env, settings, 1)
        sets.append(_pod_set(environment_pod_set(env.name), env.replicas, deployment["spec"]["template"]))
    sets.append(_pod_set(TRAINER_POD_SET, 1, trainer_admission_template(job, settings)))
    if job.spec.model.id is not None:
        download = build_model_download_job(job, settings)
        sets.append(_pod_set(MODEL_DOWNLOAD_POD_SET, 1, download["spec"]["template"]))
    if job.spec.logging.tensorboard:
        tensorboard = build_tensorboard_deployment(job, settings)
        sets.append(_pod_set(TENSORBOARD_POD_SET, 1, tensorboard["spec"]["template"]))
    return sets


def build_workload(job: api.GRPOJob, settings: OperatorSettings, priority: int | None) -> Manifest:
    """The job's Workload, in the LocalQueue of its label; ``priority`` is the value of its
    WorkloadPriorityClass (Kueue's admission webhook would fill it in; the owner must)."""
    queue = queue_name(job)
    if queue is None:
        raise ValueError(f"GRPOJob {job.metadata.name} has no {names.QUEUE_NAME_LABEL} label")
    child = names.ChildNames(job.metadata.name)
    spec: Manifest = {"queueName": queue, "podSets": pod_sets(job, settings)}
    wanted = priority_class(job)
    if wanted is not None and priority is not None:
        spec["priorityClassRef"] = {"group": GROUP, "kind": "WorkloadPriorityClass", "name": wanted}
        spec["priority"] = priority
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": metadata(job, child.workload, "workload"),
        "spec": spec,
    }


def placements(
    assignments: tuple[tuple[str, tuple[str, ...]], ...], flavors: Mapping[str, Manifest]
) -> dict[str, Placement]:
    """Per pod set, the node labels and tolerations of the ResourceFlavors Kueue admitted it with
    (``flavors``: each ResourceFlavor's spec, by name)."""
    out: dict[str, Placement] = {}
    for pod_set, flavor_names in assignments:
        selector: dict[str, str] = {}
        tolerations: list[Manifest] = []
        for flavor in dict.fromkeys(flavor_names):
            spec = flavors.get(flavor) or {}
            selector.update(spec.get("nodeLabels") or {})
            tolerations += [t for t in spec.get("tolerations") or [] if t not in tolerations]
        out[pod_set] = (selector, tolerations)
    return out


def _placed_template(template: Manifest, placement: Placement | None) -> Manifest:
    if placement is None or placement == ({}, []):
        return template
    selector, tolerations = placement
    spec = dict(template["spec"])
    if selector:
        spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **selector}
    if tolerations:
        spec["tolerations"] = [*spec.get("tolerations", []), *tolerations]
    return {**template, "spec": spec}


def placer(placement: Mapping[str, Placement] | None) -> Placer:
    """A function that puts a child's pod templates where Kueue admitted their pod sets (the identity for a
    job Kueue does not manage): the RayCluster's head and worker groups, an environment's Deployment, the
    trainer Job, the model's download Job and TensorBoard's Deployment."""
    if not placement:
        return lambda manifest: manifest

    def place(manifest: Manifest) -> Manifest:
        kind = manifest["kind"]
        spec = manifest["spec"]
        if kind == "RayCluster":
            head = {
                **spec["headGroupSpec"],
                "template": _placed_template(spec["headGroupSpec"]["template"], placement.get(HEAD_POD_SET)),
            }
            workers = [
                {**g, "template": _placed_template(g["template"], placement.get(g["groupName"]))}
                for g in spec["workerGroupSpecs"]
            ]
            return {**manifest, "spec": {**spec, "headGroupSpec": head, "workerGroupSpecs": workers}}
        labels = manifest["metadata"].get("labels", {})
        if kind == "Deployment" and names.ENVIRONMENT_LABEL in labels:
            pod_set = environment_pod_set(labels[names.ENVIRONMENT_LABEL])
        elif (kind, labels.get(names.COMPONENT_LABEL)) in _POD_SET_OF_COMPONENT:
            pod_set = _POD_SET_OF_COMPONENT[(kind, labels[names.COMPONENT_LABEL])]
        else:
            return manifest
        return {**manifest, "spec": {**spec, "template": _placed_template(spec["template"], placement.get(pod_set))}}

    return place


def _with_conditions(
    conditions: list[Manifest], wanted: dict[str, tuple[str, str]], message: str, now: str
) -> list[Manifest]:
    """``conditions`` with each of ``wanted`` (type → status, reason) set, keeping a transition time whose
    status does not change."""
    out = [c for c in conditions if c.get("type") not in wanted]
    for kind, (status, why) in wanted.items():
        before = next((c for c in conditions if c.get("type") == kind), None)
        since = before["lastTransitionTime"] if before and before.get("status") == status else now
        out.append({"type": kind, "status": status, "reason": why, "message": message, "lastTransitionTime": since})
    return out


def finished_status(conditions: list[Manifest], succeeded: bool, message: str, now: str) -> Manifest:
    """The Workload status of a job that has ended (what Kueue's job integrations write): Finished, so
    Kueue releases its quota."""
    finished = {"Finished": ("True", "Succeeded" if succeeded else "Failed")}
    return {"status": {"conditions": _with_conditions(conditions, finished, message, now)}}


def requeued_status(conditions: list[Manifest], reason: str, message: str, now: str) -> Manifest:
    """The Workload status that hands an evicted job back to Kueue once its pods are gone (what Kueue's
    job integrations write): no admission, QuotaReserved and Admitted false, Requeued true."""
    replaced = {
        "QuotaReserved": ("False", "Pending"),
        "Admitted": ("False", "NoReservation"),
        "Requeued": ("True", reason or "Evicted"),
    }
    return {"status": {"admission": None, "conditions": _with_conditions(conditions, replaced, message, now)}}
