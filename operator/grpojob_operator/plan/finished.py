"""Stage: a job that has ended (Succeeded or Failed) releases Kueue's quota, is cleaned up as
`spec.cleanupPolicy` says, and is deleted `spec.ttlSecondsAfterFinished` after it ended."""

from __future__ import annotations

import json
from datetime import timedelta

from grpojob_api import v1alpha1 as api
from grpojob_api.v1alpha1 import Phase
from grpojob_operator import kueue
from grpojob_operator.observe import WorkloadInfo
from grpojob_operator.plan.actions import DeleteJob, Patch
from grpojob_operator.plan.cleanup import child_deletions
from grpojob_operator.plan.context import GO_ON, STOP, Pass
from grpojob_operator.plan.workloads import kueue_time


def finished(pass_: Pass) -> bool:
    """Only a job that has ended; nothing after this stage runs for it."""
    job, plan, status, now = pass_.job, pass_.plan, pass_.status, pass_.now
    if not status.phase.is_terminal():
        return GO_ON
    workload: WorkloadInfo | None = pass_.observed.get("Workload", pass_.child.workload)
    if workload is not None and not workload.finished and not workload.deleting:
        # Kueue releases the job's quota once its Workload is Finished.
        done = kueue.finished_status(
            json.loads(workload.conditions), status.phase == Phase.SUCCEEDED, status.message or "", kueue_time(now)
        )
        plan.actions.append(Patch("Workload", workload.name, done, "status"))
    policy = job.spec.cleanup_policy
    if policy != api.CleanupPolicy.KEEP_ALL:
        plan.actions += child_deletions(job, pass_.observed, trainer=policy == api.CleanupPolicy.DELETE_ALL)
    ttl = job.spec.ttl_seconds_after_finished
    ended = status.completion_time
    if ttl is not None and ended is not None and now >= ended + timedelta(seconds=ttl):
        plan.actions.append(DeleteJob())
    return STOP
