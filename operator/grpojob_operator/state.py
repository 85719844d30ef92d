"""The GRPOJob state machine, in one place: from the job and what is observed of its children to the
actions to take and the status to write. Pure: no API calls, no clock (``now`` is an argument); the
one memo (`_config_map`) only saves recomputing.

    Pending ─▶ Initializing ─▶ Running ─▶ Succeeded
                   │   ▲          │
                   │   └─ retry ──┤ (trainer failed or stalled, attempt ≤ backoffLimit)
                   ▼              ▼
                 Failed ◀──── Failed (InvalidSpec, DeadlineExceeded, a stuck pod, BackoffLimitExceeded)
    any non-terminal phase ◀─▶ Suspended (spec.suspend)
    any non-terminal phase ◀─▶ Queued (label kueue.x-k8s.io/queue-name: until Kueue admits the job's
                               Workload, and again when Kueue evicts or preempts it)

A running attempt whose step has not advanced for `spec.progressDeadlineSeconds` (counted from its
trainer's start, then from each new step) is stalled: condition Stalled, and it is retried as failed.

Order of the children: the NetworkPolicy (before any pod of the job exists); for a hub model
(`spec.model.id`), its cache claim (unless the spec names one) and the download Job `<job>-model`,
whose pod reports the commit it resolved (kept in `status.modelCommit`; ModelReady); nothing else
starts before it, and a failed download (an unknown id, a missing token) fails the job with the
download's reason (ModelNotFound, ModelAccessDenied, ...). Then the RayCluster, `<job>-config`,
`<job>-generation` (and the trainer's progress ConfigMap and RBAC) → wait for the RayCluster's
HeadPodReady condition and a head pod with an IP → write `<job>-endpoints` → environment
Deployments/Services and the trainer Job, which read the endpoints with envFrom. A NeMo Gym
environment's config (`<job>-env-<name>-nemo-gym`) is written from the endpoints before its
Deployment, and a new head rolls its pods (`_nemo_gym_actions`). A retry first records the new
attempt in the status, then deletes the old trainer Job with foreground propagation (its pods go
first), then creates the next one, so an operator restarted between any two of those steps neither
loses nor repeats an attempt.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import ValidationError

from grpojob_api import admission
from grpojob_api import v1alpha1 as api
from grpojob_api.progress import parse_progress
from grpojob_api.v1alpha1 import ConditionType, Phase
from grpojob_operator import kueue, manifests, names
from grpojob_operator.observe import (
    ConfigMapInfo,
    DeploymentInfo,
    Observed,
    PodInfo,
    RayClusterInfo,
    TrainerJobInfo,
    WorkloadInfo,
)
from grpojob_operator.settings import OperatorSettings


@dataclass(frozen=True)
class Create:
    manifest: dict[str, Any]


@dataclass(frozen=True)
class Replace:
    """Make a ConfigMap's data the manifest's (``stale_keys``: keys it has that the manifest has not)."""

    manifest: dict[str, Any]
    stale_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Patch:
    """Merge-patch a child (``patch`` holds only the fields to change)."""

    api_version: str
    kind: str
    name: str
    patch: dict[str, Any]
    subresource: str = ""


@dataclass(frozen=True)
class Delete:
    api_version: str
    kind: str
    name: str
    propagation: Literal["Background", "Foreground"] = "Background"


@dataclass(frozen=True)
class DeleteJob:
    """Delete the GRPOJob itself (ttlSecondsAfterFinished)."""


Action = Create | Replace | Patch | Delete | DeleteJob


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class Plan:
    """What one reconcile pass does: actions in order, then one status write, then events."""

    status: api.GRPOJobStatus
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------
# status helpers


def set_condition(
    status: api.GRPOJobStatus, kind: ConditionType, value: bool, reason: str, message: str, now: datetime
) -> None:
    """Set a condition, keeping its lastTransitionTime unless its status flips."""
    text = "True" if value else "False"
    for i, existing in enumerate(status.conditions):
        if existing.type == kind.value:
            changed = existing.status != text
            status.conditions[i] = existing.model_copy(
                update={
                    "status": text,
                    "reason": reason,
                    "message": message,
                    "last_transition_time": now if changed else existing.last_transition_time,
                }
            )
            return
    status.conditions.append(
        api.Condition(type=kind.value, status=text, reason=reason, message=message, last_transition_time=now)
    )


def condition(status: api.GRPOJobStatus, kind: ConditionType) -> api.Condition | None:
    return next((c for c in status.conditions if c.type == kind.value), None)


def transition_events(old: api.GRPOJobStatus, new: api.GRPOJobStatus) -> list[Event]:
    """An Event when a run ends, breaks or is paused: the job succeeded or failed (``Phase<phase>``), the
    trainer failed and is retried (a Warning ``TrainerFailed``), the job was suspended or resumed.

    Each Event is an API write, and the way to Running (Initializing, the head ready, the endpoints, the
    trainer) is in the status already, one condition each with its lastTransitionTime; so that way posts
    none, and a job reaches Running within its write budget (tests/integration/operator/test_writes.py)."""
    if old.phase == new.phase:
        return []
    events = _stall_events(old, new)
    if new.attempt > old.attempt > 0:
        trainer = condition(new, ConditionType.TRAINER_RUNNING)
        message = trainer.message if trainer else f"retrying (attempt {new.attempt})"
        return [*events, Event("Warning", "TrainerFailed", message)]
    message = f"phase {old.phase.value} → {new.phase.value}" + (f": {new.message}" if new.message else "")
    if new.phase == Phase.FAILED:
        return [*events, Event("Warning", "PhaseFailed", message)]
    if new.phase in (Phase.SUCCEEDED, Phase.SUSPENDED) or (new.phase == Phase.QUEUED and old.phase != Phase.PENDING):
        return [Event("Normal", f"Phase{new.phase.value}", message)]
    if old.phase in (Phase.SUSPENDED, Phase.QUEUED):
        return [Event("Normal", "Resumed", f"phase {old.phase.value} → {new.phase.value}")]
    return events


def _stall_events(old: api.GRPOJobStatus, new: api.GRPOJobStatus) -> list[Event]:
    """A Warning when the attempt has just been found stalled (condition Stalled turned True)."""
    stalled, before = condition(new, ConditionType.STALLED), condition(old, ConditionType.STALLED)
    if stalled is None or stalled.status != "True" or (before is not None and before.status == "True"):
        return []
    return [Event("Warning", "NoProgress", stalled.message)]


def reject(plan: Plan, message: str, now: datetime) -> Plan:
    """The API server refused to create or change a child: the job fails with its answer."""
    return _fail(plan, "ChildRejected", message, now)


def _fail(plan: Plan, reason: str, message: str, now: datetime) -> Plan:
    status = plan.status
    status.phase = Phase.FAILED
    status.reason, status.message = reason, message
    status.completion_time = status.completion_time or now
    set_condition(status, ConditionType.FAILED, True, reason, message, now)
    set_condition(status, ConditionType.TRAINER_RUNNING, False, reason, message, now)
    return plan


# ------------------------------------------------------------------------------------------------
# the machine


def plan(body: dict[str, Any], observed: Observed, settings: OperatorSettings, now: datetime) -> Plan:
    """Decide the next actions and the new status of the GRPOJob ``body`` (as read from the API)."""
    old = current_status(body)
    status = old.model_copy(deep=True)
    status.observed_generation = body.get("metadata", {}).get("generation")
    result = Plan(status=status)
    try:
        job = admission.parse_job({k: v for k, v in body.items() if k != "status"})
    except ValidationError as error:
        if status.phase != Phase.FAILED:
            _fail(result, "InvalidSpec", admission.describe(error), now)
    else:
        if status.phase.is_terminal():
            _finished(job, result, observed, now)
        elif job.spec.suspend:
            _suspend(job, result, observed, now)
        else:
            _advance(job, result, observed, settings, now)
    result.events = transition_events(old, status)
    return result


def current_status(body: dict[str, Any]) -> api.GRPOJobStatus:
    """The job's status as written, ignoring fields that are not ours; empty when unreadable."""
    raw = {k: v for k, v in (body.get("status") or {}).items() if k in _STATUS_KEYS}
    try:
        return api.GRPOJobStatus.model_validate(raw)
    except ValidationError:
        return api.GRPOJobStatus()  # a status we cannot read is rebuilt from the children


_STATUS_KEYS = {f.alias or n for n, f in api.GRPOJobStatus.model_fields.items()} | set(api.GRPOJobStatus.model_fields)


def _child_deletions(job: api.GRPOJob, observed: Observed, *, trainer: bool) -> list[Action]:
    child = names.ChildNames(job.metadata.name)
    candidates: list[Delete] = [
        Delete("ray.io/v1", "RayCluster", child.raycluster),
        Delete("v1", "ConfigMap", child.endpoints),
    ]
    for env in job.spec.environments:
        candidates.append(Delete("apps/v1", "Deployment", child.environment(env.name)))
        candidates.append(Delete("v1", "Service", child.environment(env.name)))
        if env.nemo_gym is not None:
            candidates.append(Delete("v1", "ConfigMap", child.nemo_gym_config(env.name)))
    if trainer:
        candidates.append(Delete("batch/v1", "Job", child.trainer, "Foreground"))
        candidates += _tensorboard_deletions(child)
    return [d for d in candidates if observed.has(d.kind, d.name) and not _deleting(observed.get(d.kind, d.name))]


def _deleting(summary: Any) -> bool:
    return bool(getattr(summary, "deleting", False))


def _kueue_time(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _finished(job: api.GRPOJob, plan_: Plan, observed: Observed, now: datetime) -> None:
    workload: WorkloadInfo | None = observed.get("Workload", names.ChildNames(job.metadata.name).workload)
    if workload is not None and not workload.finished and not workload.deleting:
        # Kueue releases the job's quota once its Workload is Finished.
        status = plan_.status
        done = kueue.finished_status(
            json.loads(workload.conditions), status.phase == Phase.SUCCEEDED, status.message or "", _kueue_time(now)
        )
        plan_.actions.append(Patch(kueue.API_VERSION, "Workload", workload.name, done, "status"))
    policy = job.spec.cleanup_policy
    if policy != api.CleanupPolicy.KEEP_ALL:
        plan_.actions += _child_deletions(job, observed, trainer=policy == api.CleanupPolicy.DELETE_ALL)
    ttl = job.spec.ttl_seconds_after_finished
    done = plan_.status.completion_time
    if ttl is not None and done is not None and now >= done + timedelta(seconds=ttl):
        plan_.actions.append(DeleteJob())


def _suspend(job: api.GRPOJob, plan_: Plan, observed: Observed, now: datetime) -> None:
    status = plan_.status
    plan_.actions += _child_deletions(job, observed, trainer=True)
    workload = names.ChildNames(job.metadata.name).workload
    if observed.has("Workload", workload) and not _deleting(observed.get("Workload", workload)):
        # A suspended job holds no quota: its Workload goes, and a new one queues when it resumes.
        plan_.actions.append(Delete(kueue.API_VERSION, "Workload", workload))
    status.phase = Phase.SUSPENDED
    status.reason, status.message = "Suspended", "spec.suspend is true"
    status.start_time = None  # like a Kubernetes Job, activeDeadlineSeconds restarts on resume
    status.progress_time = None  # and so does progressDeadlineSeconds, from the new trainer's start
    set_condition(status, ConditionType.SUSPENDED, True, "Suspended", "spec.suspend is true", now)
    set_condition(status, ConditionType.RAY_CLUSTER_READY, False, "Suspended", "the job is suspended", now)
    set_condition(status, ConditionType.ENDPOINTS_PUBLISHED, False, "Suspended", "the job is suspended", now)
    set_condition(status, ConditionType.TRAINER_RUNNING, False, "Suspended", "the job is suspended", now)


def _stuck_pod(observed: Observed, grace: float, now: datetime) -> tuple[str, str] | None:
    for pod in observed.pods():
        if pod.deleting or not pod.stuck:
            continue
        since = pod.ready_since or pod.created or now
        if (now - since).total_seconds() >= grace:
            container, reason, message = pod.stuck[0]
            detail = f": {message}" if message else ""
            return reason, f"pod {pod.name} container {container} is in {reason}{detail}"
    return None


def _advance(job: api.GRPOJob, plan_: Plan, observed: Observed, settings: OperatorSettings, now: datetime) -> None:
    status = plan_.status
    child = names.ChildNames(job.metadata.name)
    if condition(status, ConditionType.SUSPENDED) is not None and status.phase == Phase.SUSPENDED:
        set_condition(status, ConditionType.SUSPENDED, False, "Resumed", "spec.suspend is false", now)
    status.start_time = status.start_time or now
    deadline = job.spec.active_deadline_seconds
    if deadline is not None and now >= status.start_time + timedelta(seconds=deadline):
        _fail(plan_, "DeadlineExceeded", f"the job ran longer than spec.activeDeadlineSeconds ({deadline}s)", now)
        return
    stuck = _stuck_pod(observed, settings.pod_failure_grace_seconds, now)
    if stuck is not None:
        _fail(plan_, *stuck, now)
        return
    place = kueue.placer(None)
    if kueue.queue_name(job) is not None:
        admitted = _admission(job, plan_, observed, settings, now)
        if admitted is None:
            return
        place = kueue.placer(admitted)

    # The NetworkPolicy goes first: the job's pods are never reachable from outside the job.
    policy = manifests.build_network_policy(job)
    if not observed.has("NetworkPolicy", child.network_policy):
        plan_.actions.append(Create(policy))

    # 0. A hub model is downloaded before any pod that loads it starts.
    if not _model_ready(job, plan_, observed, settings, now):
        return

    # 1. The RayCluster and the children that need no address; the config follows the spec (which may
    # have changed while the job was suspended).
    cluster_manifest = manifests.build_raycluster(job, settings)
    if not observed.has("RayCluster", child.raycluster):
        plan_.actions.append(Create(place(cluster_manifest)))
    plan_.actions += _config_map_actions(_config_map(job), observed)
    rest = [manifests.build_generation_service(job), manifests.build_progress(job), *manifests.build_trainer_rbac(job)]
    plan_.actions += [Create(m) for m in rest if not observed.has(m["kind"], m["metadata"]["name"])]
    plan_.actions += _tensorboard_actions(job, observed, settings)
    _read_progress(job, status, observed.get("ConfigMap", child.progress), now)
    trainer: TrainerJobInfo | None = observed.get("Job", child.trainer)
    if trainer is not None:
        status.attempt = max(status.attempt, trainer.attempt)  # a status rebuilt from scratch
        if (trainer.complete or trainer.failed) and trainer.attempt == status.attempt and not trainer.deleting:
            _advance_trainer(job, plan_, observed, settings, now, place)  # even with the head gone
            return

    # 2. Wait for the head (a RayCluster being deleted, after a suspend, does not count).
    cluster: RayClusterInfo | None = observed.get("RayCluster", child.raycluster)
    if cluster is not None and cluster.deleting:
        cluster = None
    head = observed.head_pod()
    if cluster is None or not cluster.head_pod_ready or head is None:
        # One reason from the RayCluster's creation to its ready head, so that its progress through KubeRay's
        # states costs no status write; only what the user must see (a pod that cannot be placed) does.
        reason, message = "WaitingForRayHead", "waiting for the Ray head pod"
        unplaced = [p for p in observed.pods() if p.unschedulable and not p.deleting]
        if unplaced:
            # Not a failure (capacity may come: an autoscaler, a queue), but the user should see why.
            message += f"; pod {unplaced[0].name} cannot be scheduled: {unplaced[0].unschedulable}"
        set_condition(status, ConditionType.RAY_CLUSTER_READY, False, reason, message, now)
        trainer_running = condition(status, ConditionType.TRAINER_RUNNING)
        if not (trainer_running and trainer_running.status == "True"):
            status.phase = Phase.INITIALIZING
        return
    # The workers' count is not in the message: each worker's start would be a status write.
    set_condition(status, ConditionType.RAY_CLUSTER_READY, True, "HeadPodReady", f"head pod {head.name}", now)

    # 3. Publish the endpoints (again, when the head pod or the attempt changed).
    status.attempt = max(status.attempt, 1)
    endpoints = manifests.build_endpoints(job, settings, head.ip or "", status.attempt)
    plan_.actions += _config_map_actions(endpoints, observed)
    status.gcs_address = manifests.gcs_address(job, settings)
    set_condition(
        status,
        ConditionType.ENDPOINTS_PUBLISHED,
        True,
        "EndpointsPublished",
        f"{child.endpoints}: GCS {status.gcs_address}, head pod IP {head.ip}",
        now,
    )

    # 4. Environments.
    not_ready = []
    for env in job.spec.environments:
        name = child.environment(env.name)
        if env.nemo_gym is not None:
            plan_.actions += _nemo_gym_actions(job, env, settings, endpoints["data"], head.name, observed, place)
        elif not observed.has("Deployment", name):
            plan_.actions.append(
                Create(place(manifests.build_environment_deployment(job, env, settings, status.attempt)))
            )
        if not observed.has("Service", name):
            plan_.actions.append(Create(manifests.build_environment_service(job, env)))
        deployment: DeploymentInfo | None = observed.get("Deployment", name)
        if deployment is None or deployment.ready_replicas < env.replicas:
            ready = deployment.ready_replicas if deployment else 0
            not_ready.append(f"{env.name} {ready}/{env.replicas}")
    if not_ready:
        set_condition(
            status,
            ConditionType.ENVIRONMENTS_READY,
            False,
            "EnvironmentsStarting",
            "ready: " + ", ".join(not_ready),
            now,
        )
    else:
        count = len(job.spec.environments)
        set_condition(status, ConditionType.ENVIRONMENTS_READY, True, "EnvironmentsReady", f"{count} ready", now)

    # 5. The trainer.
    _advance_trainer(job, plan_, observed, settings, now, place)


def _admission(
    job: api.GRPOJob, plan_: Plan, observed: Observed, settings: OperatorSettings, now: datetime
) -> dict[str, kueue.Placement] | None:
    """Kueue's say over a job labelled with a queue name: its Workload is created first, and nothing else
    until Kueue admits it; an evicted (or preempted) job loses its pods and is handed back to Kueue, then
    waits again. Returns where the admitted pod sets go, or None while the job may not run (Queued)."""
    status = plan_.status
    child = names.ChildNames(job.metadata.name)
    workload: WorkloadInfo | None = observed.get("Workload", child.workload)

    def queued(reason: str, message: str) -> None:
        status.phase = Phase.QUEUED
        status.reason, status.message = reason, message
        status.start_time = None  # the deadlines count from the admitted run, as after a suspend
        status.progress_time = None
        set_condition(status, ConditionType.ADMITTED, False, reason, message, now)

    queue = kueue.queue_name(job)
    if workload is None or workload.deleting:
        if observed.kueue.problem:
            queued("WorkloadNotCreated", observed.kueue.problem)
            return None
        if workload is None:
            plan_.actions.append(Create(kueue.build_workload(job, settings, observed.kueue.priority)))
        queued("WaitingForAdmission", f"waiting for Kueue to admit workload {child.workload} (LocalQueue {queue})")
        return None
    if workload.admitted:
        flavors = ", ".join(sorted({f for _, names_ in workload.assignments for f in names_}))
        set_condition(status, ConditionType.ADMITTED, True, "Admitted", f"admitted by Kueue (flavors {flavors})", now)
        return kueue.placements(workload.assignments, observed.kueue.flavors)
    # Not admitted, or being evicted: the job runs no pod, and an evicted job goes back to Kueue's queue.
    plan_.actions += _child_deletions(job, observed, trainer=True)
    if workload.evicted is not None:
        reason, message = workload.evicted
        if workload.has_admission and not observed.pods():
            conditions = json.loads(workload.conditions)
            requeue = kueue.requeued_status(conditions, reason, message, _kueue_time(now))
            plan_.actions.append(Patch(kueue.API_VERSION, "Workload", child.workload, requeue, "status"))
        queued(reason or "Evicted", f"evicted by Kueue: {message}")
        return None
    waiting = workload.waiting or f"waiting for Kueue to admit workload {child.workload} (LocalQueue {queue})"
    queued("WaitingForAdmission", waiting)
    return None


def _tensorboard_deletions(child: names.ChildNames) -> list[Delete]:
    return [Delete("apps/v1", "Deployment", child.tensorboard), Delete("v1", "Service", child.tensorboard)]


def _tensorboard_actions(job: api.GRPOJob, observed: Observed, settings: OperatorSettings) -> list[Action]:
    """TensorBoard follows `spec.logging.tensorboard`: created when it is true (it needs no address, and
    shows each attempt's run as it appears), deleted when it is turned off."""
    child = names.ChildNames(job.metadata.name)
    if not job.spec.logging.tensorboard:
        return [
            d
            for d in _tensorboard_deletions(child)
            if observed.has(d.kind, d.name) and not _deleting(observed.get(d.kind, d.name))
        ]
    wanted = [manifests.build_tensorboard_deployment(job, settings), manifests.build_tensorboard_service(job)]
    return [Create(m) for m in wanted if not observed.has(m["kind"], m["metadata"]["name"])]


def _nemo_gym_actions(
    job: api.GRPOJob,
    env: api.EnvironmentSpec,
    settings: OperatorSettings,
    endpoints: dict[str, str],
    head_pod: str,
    observed: Observed,
    place: kueue.Placer,
) -> list[Action]:
    """A NeMo Gym environment's config and Deployment, following the endpoints: when the config or the Ray
    head changed, the config is rewritten first, then the pod template's hash, which rolls the pods."""
    actions = _config_map_actions(manifests.build_nemo_gym_config_map(job, env, endpoints), observed)
    deployment = manifests.build_nemo_gym_deployment(job, env, settings, endpoints, head_pod)
    current: DeploymentInfo | None = observed.get("Deployment", deployment["metadata"]["name"])
    wanted = deployment["spec"]["template"]["metadata"]["annotations"][names.NEMO_GYM_CONFIG_HASH_ANNOTATION]
    if current is None:
        actions.append(Create(place(deployment)))
    elif current.nemo_gym_config_hash != wanted:
        annotations = {names.NEMO_GYM_CONFIG_HASH_ANNOTATION: wanted}
        patch = {"spec": {"template": {"metadata": {"annotations": annotations}}}}
        actions.append(Patch("apps/v1", "Deployment", current.name, patch))
    return actions


_CONFIG_MAPS: OrderedDict[tuple[str, ...], dict[str, Any]] = OrderedDict()
_CONFIG_MAPS_LOCK = threading.Lock()
_CONFIG_MAPS_KEPT = 4096


def _config_map(job: api.GRPOJob) -> dict[str, Any]:
    """`manifests.build_config_map`, remembered per job and spec: rendering the config as YAML is nine tenths
    of a pass that changes nothing (PyYAML is pure Python), and passes run every few seconds per job.
    The manifest returned is shared: never change it."""
    meta = job.metadata
    key = (meta.uid or "", meta.namespace or "", meta.name, job.spec.model_dump_json())
    with _CONFIG_MAPS_LOCK:
        known = _CONFIG_MAPS.get(key)
        if known is not None:
            _CONFIG_MAPS.move_to_end(key)
            return known
    manifest = manifests.build_config_map(job)
    with _CONFIG_MAPS_LOCK:
        _CONFIG_MAPS[key] = manifest
        while len(_CONFIG_MAPS) > _CONFIG_MAPS_KEPT:
            _CONFIG_MAPS.popitem(last=False)
    return manifest


def _config_map_actions(manifest: dict[str, Any], observed: Observed) -> list[Action]:
    """Create a ConfigMap, or make its data the manifest's when it differs."""
    current: ConfigMapInfo | None = observed.get("ConfigMap", manifest["metadata"]["name"])
    if current is None:
        return [Create(manifest)]
    data = current.as_dict()
    if data == manifest["data"]:
        return []
    return [Replace(manifest, tuple(sorted(data.keys() - manifest["data"].keys())))]


def _advance_trainer(
    job: api.GRPOJob,
    plan_: Plan,
    observed: Observed,
    settings: OperatorSettings,
    now: datetime,
    place: kueue.Placer,
) -> None:
    status = plan_.status
    child = names.ChildNames(job.metadata.name)
    trainer: TrainerJobInfo | None = observed.get("Job", child.trainer)
    pods = [p for p in observed.pods() if p.component == "trainer"]

    def waiting(reason: str, message: str) -> None:
        set_condition(status, ConditionType.TRAINER_RUNNING, False, reason, message, now)
        status.phase = Phase.INITIALIZING

    if trainer is not None and (trainer.attempt < status.attempt or trainer.deleting):
        if not trainer.deleting:
            plan_.actions.append(Delete("batch/v1", "Job", child.trainer, "Foreground"))
        waiting("RestartingTrainer", f"removing attempt {trainer.attempt} before attempt {status.attempt}")
        return
    if trainer is None:
        leftovers = [p.name for p in pods if p.attempt is not None and p.attempt < status.attempt]
        if leftovers:
            waiting("RestartingTrainer", f"waiting for pods of the previous attempt to go: {', '.join(leftovers)}")
            return
        plan_.actions.append(
            Create(place(manifests.build_trainer_job(job, settings, status.attempt, status.model_commit)))
        )
        waiting("TrainerStarting", f"attempt {status.attempt}: waiting for the trainer pod")
        return
    if trainer.complete:
        status.phase = Phase.SUCCEEDED
        status.reason, status.message = "Completed", f"the trainer finished (attempt {status.attempt})"
        status.completion_time = status.completion_time or now
        set_condition(status, ConditionType.TRAINER_RUNNING, False, "Completed", status.message, now)
        set_condition(status, ConditionType.COMPLETE, True, "Completed", status.message, now)
        return
    if trainer.failed:
        _retry_or_fail(job, plan_, _trainer_failure(trainer, pods), now)
        return
    current = [p for p in pods if p.attempt == status.attempt and not p.deleting]
    running = [p for p in current if p.phase == "Running"]
    exited = [p for p in current if p.phase in ("Succeeded", "Failed")]
    if running:
        status.progress_time = status.progress_time or now  # the deadline counts from the trainer's start
        stall = _stall(job, status, now)
        if stall is not None:
            set_condition(status, ConditionType.STALLED, True, "NoProgress", stall, now)
            _retry_or_fail(job, plan_, stall, now)
            return
    if running or exited:
        # A pod that has ended before the Job controller's verdict (complete or failed) keeps the job
        # running, not back to Initializing, until that verdict comes.
        pod = (running or exited)[0]
        if running:
            status.reason, status.message = "TrainerRunning", f"pod {pod.name}"
        else:
            status.reason, status.message = "TrainerExiting", f"pod {pod.name} ended ({pod.phase}); waiting for the Job"
        status.phase = Phase.RUNNING
        set_condition(status, ConditionType.TRAINER_RUNNING, True, status.reason, status.message, now)
    else:
        waiting("TrainerStarting", f"attempt {status.attempt}: waiting for the trainer pod")


def _retry_or_fail(job: api.GRPOJob, plan_: Plan, cause: str, now: datetime) -> None:
    """The current attempt failed: start the next one (the next pass replaces the trainer Job), or fail
    the job when `spec.backoffLimit` retries are used up."""
    status = plan_.status
    allowed = job.spec.backoff_limit + 1
    if status.attempt < allowed:
        message = f"attempt {status.attempt} of {allowed} failed: {cause}; retrying"
        status.attempt += 1
        status.progress_time = None
        set_condition(status, ConditionType.TRAINER_RUNNING, False, "TrainerFailed", message, now)
        status.phase = Phase.INITIALIZING
    else:
        limit = job.spec.backoff_limit
        message = f"the trainer failed {status.attempt} times (spec.backoffLimit is {limit}); last: {cause}"
        _fail(plan_, "BackoffLimitExceeded", message, now)


def _stall(job: api.GRPOJob, status: api.GRPOJobStatus, now: datetime) -> str | None:
    """Why the running attempt counts as stalled (its step has not advanced within
    `spec.progressDeadlineSeconds`), or None."""
    deadline = job.spec.progress_deadline_seconds
    since = status.progress_time
    if deadline is None or since is None or now < since + timedelta(seconds=deadline):
        return None
    last = "no step finished" if status.step is None else f"step {status.step} was the last"
    return (
        f"the trainer made no progress for {deadline}s (spec.progressDeadlineSeconds): {last}, "
        f"last progress at {since.isoformat(timespec='seconds')}"
    )


def _trainer_failure(trainer: TrainerJobInfo, pods: list[PodInfo]) -> str:
    for pod in pods:
        if pod.attempt == trainer.attempt:
            for container, code, detail in pod.terminated:
                if code != 0:
                    return f"pod {pod.name} container {container} exited with code {code}" + (
                        f" ({detail})" if detail else ""
                    )
    return trainer.failure_message or "the trainer Job failed"


def _read_progress(job: api.GRPOJob, status: api.GRPOJobStatus, progress: ConfigMapInfo | None, now: datetime) -> None:
    """Copy the trainer's reported step, mean reward and exported model into the status; a new step is
    progress."""
    if progress is not None:
        report = parse_progress(progress.as_dict())
        if report is not None:
            if report.step != status.step:
                status.progress_time = now
                stalled = condition(status, ConditionType.STALLED)
                if stalled is not None and stalled.status == "True":
                    set_condition(status, ConditionType.STALLED, False, "Progressing", f"step {report.step}", now)
            status.step, status.mean_reward = report.step, report.mean_reward
            if report.output_model is not None and report.output_model_step is not None:
                status.output_model = manifests.output_model_status(job, report.output_model, report.output_model_step)


def _model_ready(job: api.GRPOJob, plan_: Plan, observed: Observed, settings: OperatorSettings, now: datetime) -> bool:
    """Whether the model can be loaded: a path always; a hub id once its download Job has reported the commit
    it resolved (into ``status.modelCommit``). Until then: the cache claim and the download Job, the
    ModelReady condition saying how far it is; the job fails on a failed download, with its reason."""
    model, status = job.spec.model, plan_.status
    if model.id is None or status.model_commit:
        return True
    child = names.ChildNames(job.metadata.name)
    claim = manifests.model_cache_claim(job)
    what = f"{model.id} at revision {model.revision or 'main'}"
    if claim == child.model_cache and not observed.has("PersistentVolumeClaim", claim):
        plan_.actions.append(Create(manifests.build_model_cache_claim(job)))
    download: TrainerJobInfo | None = observed.get("Job", child.model_download)
    status.phase = Phase.INITIALIZING
    if download is None:
        plan_.actions.append(Create(manifests.build_model_download_job(job, settings)))
        set_condition(status, ConditionType.MODEL_READY, False, "Downloading", f"downloading {what} into {claim}", now)
        return False
    pods = [p for p in observed.pods() if p.component == "model-download" and not p.deleting]
    report = _download_report(pods)
    for pod in pods:
        if pod.stuck:  # a missing token Secret (or key) does not appear by waiting
            _, reason, message = pod.stuck[0]
            _fail(plan_, "ModelDownloadFailed", f"the download of {what} cannot start: {reason}: {message}", now)
            return False
    if download.failed:
        reason = str(report.get("reason") or "ModelDownloadFailed")
        message = str(report.get("message") or download.failure_message or "the download Job failed")
        _fail(plan_, reason if reason.isalnum() else "ModelDownloadFailed", f"{what}: {message}", now)
        return False
    if download.complete:
        commit = str(report.get("commit") or "")
        if not commit and any(pod.phase not in ("Succeeded", "Failed") for pod in pods):
            # The Pod and Job watches are separate streams: the Job's end may arrive before its pod's.
            set_condition(
                status, ConditionType.MODEL_READY, False, "Downloading", f"downloading {what} into {claim}", now
            )
            return False
        if not commit:  # its pod (and report) is gone: download again (from the cache, so at once)
            if not download.deleting:
                plan_.actions.append(Delete("batch/v1", "Job", child.model_download, "Foreground"))
            return False
        status.model_commit = commit
        message = f"{model.id} at commit {commit} (revision {model.revision or 'main'}) in {claim}"
        set_condition(status, ConditionType.MODEL_READY, True, "Downloaded", message, now)
        return True
    set_condition(status, ConditionType.MODEL_READY, False, "Downloading", f"downloading {what} into {claim}", now)
    return False


def _download_report(pods: list[PodInfo]) -> dict[str, Any]:
    """The download pod's report (its termination message: JSON), or {} when there is none."""
    for pod in pods:
        if pod.termination_message:
            try:
                report = json.loads(pod.termination_message)
            except json.JSONDecodeError:
                return {"message": pod.termination_message[-1000:]}
            return report if isinstance(report, dict) else {}
    return {}
