"""Stage: the limits that fail a running job: `spec.activeDeadlineSeconds` (counted from the start time it
sets) and a pod stuck in a state that never resolves on its own (for `pod_failure_grace_seconds`)."""

from __future__ import annotations

from datetime import datetime, timedelta

from grpojob_operator.observe import Observed
from grpojob_operator.plan.conditions import fail
from grpojob_operator.plan.context import GO_ON, STOP, Pass


def deadlines(pass_: Pass) -> bool:
    """Set the start time; fail the job past its active deadline or on a stuck pod."""
    job, status, now = pass_.job, pass_.status, pass_.now
    status.start_time = status.start_time or now
    deadline = job.spec.active_deadline_seconds
    if deadline is not None and now >= status.start_time + timedelta(seconds=deadline):
        fail(pass_.plan, "DeadlineExceeded", f"the job ran longer than spec.activeDeadlineSeconds ({deadline}s)", now)
        return STOP
    stuck = stuck_pod(pass_.observed, pass_.settings.pod_failure_grace_seconds, now)
    if stuck is not None:
        fail(pass_.plan, *stuck, now)
        return STOP
    return GO_ON


def stuck_pod(observed: Observed, grace: float, now: datetime) -> tuple[str, str] | None:
    """(reason, message) of the first pod stuck for at least ``grace`` seconds, or None."""
    for pod in observed.pods():
        if pod.deleting or not pod.stuck:
            continue
        since = pod.ready_since or pod.created or now
        if (now - since).total_seconds() >= grace:
            container, reason, message = pod.stuck[0]
            detail = f": {message}" if message else ""
            return reason, f"pod {pod.name} container {container} is in {reason}{detail}"
    return None
