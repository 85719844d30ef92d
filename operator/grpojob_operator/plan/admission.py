"""Stage: Kueue's say over a job labelled with a queue name. Its Workload is created first, and nothing
else until Kueue admits it; an evicted (or preempted) job loses its pods and is handed back to Kueue, then
waits again (Queued). An admitted job's children go where Kueue placed their pod sets."""

from __future__ import annotations

import json

from grpojob_api.v1alpha1 import ConditionType, Phase
from grpojob_operator import kueue
from grpojob_operator.observe import WorkloadInfo
from grpojob_operator.plan.actions import Create, Patch
from grpojob_operator.plan.cleanup import child_deletions
from grpojob_operator.plan.conditions import set_condition
from grpojob_operator.plan.context import GO_ON, STOP, Pass
from grpojob_operator.plan.workloads import kueue_time


def admission(pass_: Pass) -> bool:
    """Go on (with ``pass_.place`` set) once Kueue has admitted the job; a job without a queue goes on as it is."""
    queue = kueue.queue_name(pass_.job)
    if queue is None:
        return GO_ON
    placements = _admitted(pass_, queue)
    if placements is None:
        return STOP
    pass_.place = kueue.placer(placements)
    return GO_ON


def _admitted(pass_: Pass, queue: str) -> dict[str, kueue.Placement] | None:
    """Where the admitted pod sets go, or None while the job may not run (Queued)."""
    job, plan, status, observed, now = pass_.job, pass_.plan, pass_.status, pass_.observed, pass_.now
    child = pass_.child
    workload: WorkloadInfo | None = observed.get("Workload", child.workload)

    def queued(reason: str, message: str) -> None:
        status.phase = Phase.QUEUED
        status.reason, status.message = reason, message
        status.start_time = None  # the deadlines count from the admitted run, as after a suspend
        status.progress_time = None
        set_condition(status, ConditionType.ADMITTED, False, reason, message, now)

    if workload is None or workload.deleting:
        if observed.kueue.problem:
            queued("WorkloadNotCreated", observed.kueue.problem)
            return None
        if workload is None:
            plan.actions.append(Create(kueue.build_workload(job, pass_.settings, observed.kueue.priority)))
        queued("WaitingForAdmission", f"waiting for Kueue to admit workload {child.workload} (LocalQueue {queue})")
        return None
    if workload.admitted:
        flavors = ", ".join(sorted({f for _, names_ in workload.assignments for f in names_}))
        set_condition(status, ConditionType.ADMITTED, True, "Admitted", f"admitted by Kueue (flavors {flavors})", now)
        return kueue.placements(workload.assignments, observed.kueue.flavors)
    # Not admitted, or being evicted: the job runs no pod, and an evicted job goes back to Kueue's queue.
    plan.actions += child_deletions(job, observed, trainer=True)
    if workload.evicted is not None:
        reason, message = workload.evicted
        if workload.has_admission and not observed.pods():
            conditions = json.loads(workload.conditions)
            requeue = kueue.requeued_status(conditions, reason, message, kueue_time(now))
            plan.actions.append(Patch("Workload", child.workload, requeue, "status"))
        queued(reason or "Evicted", f"evicted by Kueue: {message}")
        return None
    waiting = workload.waiting or f"waiting for Kueue to admit workload {child.workload} (LocalQueue {queue})"
    queued("WaitingForAdmission", waiting)
    return None
