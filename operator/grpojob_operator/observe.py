"""What the operator sees of a GRPOJob's children: small, immutable summaries of the API objects.

The operator keeps these summaries in Kopf indexes (in-memory caches fed by watches), so a reconcile
pass reads no API object: `summarize` turns a watched body into the summary the state machine needs,
and `Observed` gathers a job's summaries.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from grpojob_operator import names

# Container states that never resolve on their own: the job fails fast on them after a grace period.
STUCK_WAITING_REASONS = frozenset(
    {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CrashLoopBackOff", "CreateContainerConfigError"}
)
REASON_LIMIT = 300
"""The most characters of a container's termination message a condition quotes."""
TAIL_LINES = 5
TAIL_LIMIT = 500
"""The most lines and characters of a crashed container's log (its termination message) a condition quotes."""


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def last_line(message: str, limit: int = REASON_LIMIT) -> str:
    """The last non-empty line of a container's termination message, at most ``limit`` characters: the
    one-line reason it wrote, or the last line of its log (a traceback's exception) when it wrote none."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def last_lines(message: str, lines: int = TAIL_LINES, limit: int = TAIL_LIMIT) -> str:
    """The last ``lines`` non-empty lines of a container's termination message joined by " | ", at most
    ``limit`` characters (the end kept): the tail of its log, where a server says why it stopped."""
    kept = [line.strip() for line in message.splitlines() if line.strip()][-lines:]
    tail = " | ".join(kept)
    return tail if len(tail) <= limit else "…" + tail[len(tail) - limit + 1 :]


def _crash(container: dict[str, Any]) -> tuple[str, str, str] | None:
    """(container, how its run ended, the tail of its log) when its current run ended with an error or it
    was restarted after its last one; None for a container that runs, or one that completed."""
    state = container.get("state") or {}
    ended = state.get("terminated")
    if not ended or int(ended.get("exitCode", 0)) == 0:
        ended = (container.get("lastState") or {}).get("terminated")
    if not ended:
        return None
    how = ", ".join(filter(None, [f"exit code {ended.get('exitCode')}", ended.get("reason")]))
    return container.get("name", ""), how, last_lines(ended.get("message") or "")


def _ended(terminated: dict[str, Any]) -> str:
    """A terminated container state's reason and the last line of its message, as "reason: message"."""
    return ": ".join(filter(None, [terminated.get("reason"), last_line(terminated.get("message") or "")]))


def _condition(conditions: list[dict[str, Any]] | None, kind: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == kind), None)


@dataclass(frozen=True)
class PodInfo:
    name: str
    component: str
    attempt: int | None
    phase: str
    ready: bool
    ip: str | None
    deleting: bool
    created: datetime | None
    ready_since: datetime | None
    """When the Ready condition last changed (how long a pod has been broken)."""
    stuck: tuple[tuple[str, str, str], ...] = ()
    """(container, reason, message) of containers waiting in a reason from STUCK_WAITING_REASONS; a
    restarting container's message ends with how its last run ended (the reason it crashed)."""
    terminated: tuple[tuple[str, int, str], ...] = ()
    """(container, exit code, reason and last line of its message) of terminated containers."""
    unschedulable: str = ""
    """The scheduler's message when it cannot place the pod (no GPUs free, a missing claim, ...)."""
    termination_message: str = ""
    """The message of its first terminated container that left one (the model download's report)."""
    environment: str = ""
    """The environment (`spec.environments[].name`) whose server the pod runs, for an environment's pod."""
    crashed: tuple[tuple[str, str, str], ...] = ()
    """(container, how its run ended, e.g. "exit code 1, Error", the last lines of its termination message)
    of its regular containers that stopped with an error or were restarted: the same while a crash-looping
    container waits to restart and runs again, so a condition quoting it does not change between crashes."""
    scheduled: bool = True
    """Bound to a node (``spec.nodeName`` set)."""


@dataclass(frozen=True)
class TrainerJobInfo:
    name: str
    attempt: int
    complete: bool
    failed: bool
    failure_message: str
    deleting: bool


@dataclass(frozen=True)
class DeploymentInfo:
    name: str
    ready_replicas: int
    nemo_gym_config_hash: str = ""
    """The pod template's `names.NEMO_GYM_CONFIG_HASH_ANNOTATION` (NeMo Gym environments only)."""


@dataclass(frozen=True)
class RayClusterInfo:
    """A RayCluster exists (and whether it is on its way out). Its status is not read: the head's readiness comes
    from the head pod itself (see `Observed.head_pod`), so KubeRay's status writes wake no pass."""

    name: str
    deleting: bool


@dataclass(frozen=True)
class ConfigMapInfo:
    name: str
    data: tuple[tuple[str, str], ...]

    def as_dict(self) -> dict[str, str]:
        return dict(self.data)


@dataclass(frozen=True)
class WorkloadInfo:
    """A job's Kueue Workload: whether Kueue admitted it, why it waits, and with which flavors."""

    name: str
    admitted: bool
    """Admitted and holding an admission, and not being evicted: the job's children may run."""
    has_admission: bool
    evicted: tuple[str, str] | None
    """(reason, message) while the Evicted condition is true."""
    waiting: str
    """Why it is not admitted (Kueue's QuotaReserved message), when it is not."""
    assignments: tuple[tuple[str, tuple[str, ...]], ...]
    """Per pod set of the admission, the ResourceFlavors of its resources."""
    conditions: str
    """The Workload's status conditions as JSON (written back when the operator requeues it)."""
    deleting: bool
    finished: bool = False


@dataclass(frozen=True)
class OtherInfo:
    """A child whose contents do not matter, only its existence (Service, ServiceAccount, RBAC)."""

    name: str
    deleting: bool


Summary = PodInfo | TrainerJobInfo | DeploymentInfo | RayClusterInfo | ConfigMapInfo | WorkloadInfo | OtherInfo


def summarize(kind: str, body: dict[str, Any]) -> Summary:
    """Reduce a watched object of ``kind`` to what the state machine reads."""
    meta = body.get("metadata", {})
    status = body.get("status") or {}
    name = meta.get("name", "")
    deleting = meta.get("deletionTimestamp") is not None
    labels = meta.get("labels") or {}
    if kind == "Pod":
        ready = _condition(status.get("conditions"), "Ready")
        stuck, terminated, messages = [], [], []
        crashed = [c for c in map(_crash, status.get("containerStatuses") or []) if c is not None]
        for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            state = container.get("state") or {}
            waiting, ended = state.get("waiting") or {}, state.get("terminated")
            if waiting.get("reason") in STUCK_WAITING_REASONS:
                last_run = (container.get("lastState") or {}).get("terminated")
                crash = (
                    f"its last run exited with code {last_run.get('exitCode')} ({_ended(last_run)})" if last_run else ""
                )
                message = "; ".join(filter(None, [waiting.get("message", ""), crash]))
                stuck.append((container.get("name", ""), waiting["reason"], message))
            if ended:
                terminated.append((container.get("name", ""), int(ended.get("exitCode", 0)), _ended(ended)))
                if ended.get("message"):
                    messages.append(ended["message"])
        attempt = labels.get(names.ATTEMPT_LABEL)
        scheduled = _condition(status.get("conditions"), "PodScheduled") or {}
        unschedulable = scheduled.get("message", "") if scheduled.get("reason") == "Unschedulable" else ""
        return PodInfo(
            name=name,
            component=labels.get(names.COMPONENT_LABEL, ""),
            attempt=int(attempt) if attempt and attempt.isdigit() else None,
            phase=status.get("phase", "Pending"),
            ready=bool(ready and ready.get("status") == "True"),
            ip=status.get("podIP"),
            deleting=deleting,
            created=_time(meta.get("creationTimestamp")),
            ready_since=_time(ready.get("lastTransitionTime")) if ready else None,
            stuck=tuple(stuck),
            terminated=tuple(terminated),
            unschedulable=unschedulable,
            termination_message=messages[0] if messages else "",
            environment=labels.get(names.ENVIRONMENT_LABEL, ""),
            crashed=tuple(crashed),
            scheduled=bool((body.get("spec") or {}).get("nodeName")),
        )
    if kind == "Job":
        conditions = status.get("conditions")
        failed = _condition(conditions, "Failed")
        complete = _condition(conditions, "Complete")
        attempt = labels.get(names.ATTEMPT_LABEL, "0")
        return TrainerJobInfo(
            name=name,
            attempt=int(attempt) if attempt.isdigit() else 0,
            complete=bool(complete and complete.get("status") == "True"),
            failed=bool(failed and failed.get("status") == "True"),
            failure_message=(failed or {}).get("message", "") or (failed or {}).get("reason", ""),
            deleting=deleting,
        )
    if kind == "Deployment":
        spec = body.get("spec") or {}
        template_annotations = ((spec.get("template") or {}).get("metadata") or {}).get("annotations") or {}
        return DeploymentInfo(
            name=name,
            ready_replicas=int(status.get("readyReplicas") or 0),
            nemo_gym_config_hash=template_annotations.get(names.NEMO_GYM_CONFIG_HASH_ANNOTATION, ""),
        )
    if kind == "RayCluster":
        return RayClusterInfo(name=name, deleting=deleting)
    if kind == "Workload":
        return _workload(name, status, deleting)
    if kind == "ConfigMap":
        return ConfigMapInfo(name=name, data=tuple(sorted((body.get("data") or {}).items())))
    return OtherInfo(name=name, deleting=deleting)


def _workload(name: str, status: dict[str, Any], deleting: bool) -> WorkloadInfo:
    conditions = status.get("conditions") or []

    def true(kind: str) -> dict[str, Any] | None:
        found = _condition(conditions, kind)
        return found if found and found.get("status") == "True" else None

    admission = status.get("admission") or {}
    evicted = true("Evicted")
    reserved = _condition(conditions, "QuotaReserved") or {}
    assignments = tuple(
        (a.get("name", ""), tuple(sorted(set((a.get("flavors") or {}).values()))))
        for a in admission.get("podSetAssignments") or []
    )
    return WorkloadInfo(
        name=name,
        admitted=bool(true("Admitted") and admission and not evicted),
        has_admission=bool(admission),
        evicted=(evicted.get("reason", ""), evicted.get("message", "")) if evicted else None,
        waiting="" if reserved.get("status") == "True" else reserved.get("message", ""),
        assignments=assignments,
        conditions=json.dumps(conditions, sort_keys=True),
        deleting=deleting,
        finished=bool(true("Finished")),
    )


@dataclass(frozen=True)
class KueueContext:
    """What a job Kueue manages needs from cluster-scoped Kueue objects (read by the operator's edge):
    its WorkloadPriorityClass's value, and the admitted ResourceFlavors' specs."""

    priority: int | None = None
    flavors: dict[str, dict[str, Any]] = field(default_factory=dict)
    problem: str = ""
    """Why they could not be read (a WorkloadPriorityClass that does not exist, say)."""


@dataclass(frozen=True)
class Observed:
    """Every child of one GRPOJob, by kind and name, as last seen by the watches."""

    children: dict[str, dict[str, Summary]] = field(default_factory=dict)
    kueue: KueueContext = field(default_factory=KueueContext)

    def get(self, kind: str, name: str) -> Any:
        return self.children.get(kind, {}).get(name)

    def has(self, kind: str, name: str) -> bool:
        return name in self.children.get(kind, {})

    def pods(self) -> list[PodInfo]:
        return sorted(self.children.get("Pod", {}).values(), key=lambda p: p.name)  # type: ignore[arg-type]

    def head_pod(self) -> PodInfo | None:
        """The head pod that is Running and Ready with an IP (not one on its way out), if there is one.

        Ready is KubeRay's readiness probe on the head (the raylet's and the GCS's health endpoints), the same
        signal KubeRay copies into the RayCluster's HeadPodReady condition, read here without waiting for
        KubeRay to reconcile: at 1,000 jobs that copy lagged the pods by over 20 minutes."""
        heads = [
            p
            for p in self.pods()
            if p.component == names.HEAD_COMPONENT and p.phase == "Running" and p.ready and p.ip and not p.deleting
        ]
        return heads[0] if heads else None
