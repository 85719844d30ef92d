"""Stages: `spec.suspend` deletes what runs (like a Kubernetes Job's suspend) and holds the job in
Suspended; turning it off resumes the job, its deadlines counted afresh."""

from __future__ import annotations

from grpojob_api.v1alpha1 import ConditionType, Phase
from grpojob_operator.plan.actions import Delete
from grpojob_operator.plan.cleanup import child_deletions, deleting
from grpojob_operator.plan.conditions import condition, set_condition
from grpojob_operator.plan.context import GO_ON, STOP, Pass


def suspended(pass_: Pass) -> bool:
    """Only a job with spec.suspend; nothing after this stage runs for it."""
    job, plan, status, now = pass_.job, pass_.plan, pass_.status, pass_.now
    if not job.spec.suspend:
        return GO_ON
    plan.actions += child_deletions(job, pass_.observed, trainer=True)
    workload = pass_.child.workload
    if pass_.observed.has("Workload", workload) and not deleting(pass_.observed.get("Workload", workload)):
        # A suspended job holds no quota: its Workload goes, and a new one queues when it resumes.
        plan.actions.append(Delete("Workload", workload))
    status.phase = Phase.SUSPENDED
    status.reason, status.message = "Suspended", "spec.suspend is true"
    status.start_time = None  # like a Kubernetes Job, activeDeadlineSeconds restarts on resume
    status.progress_time = None  # and so does progressDeadlineSeconds, from the new trainer's start
    set_condition(status, ConditionType.SUSPENDED, True, "Suspended", "spec.suspend is true", now)
    set_condition(status, ConditionType.RAY_CLUSTER_READY, False, "Suspended", "the job is suspended", now)
    set_condition(status, ConditionType.ENDPOINTS_PUBLISHED, False, "Suspended", "the job is suspended", now)
    set_condition(status, ConditionType.TRAINER_RUNNING, False, "Suspended", "the job is suspended", now)
    return STOP


def resumed(pass_: Pass) -> bool:
    """A suspended job whose spec.suspend is off again: condition Suspended turns False."""
    status = pass_.status
    if condition(status, ConditionType.SUSPENDED) is not None and status.phase == Phase.SUSPENDED:
        set_condition(status, ConditionType.SUSPENDED, False, "Resumed", "spec.suspend is false", pass_.now)
    return GO_ON
