"""The job's status conditions, the verdicts that end a job (failed, a child the API server refused), and the
wait for a ResourceQuota."""

from __future__ import annotations

from datetime import datetime

from grpojob_api import v1alpha1 as api
from grpojob_api.v1alpha1 import ConditionType, Phase
from grpojob_operator.plan.actions import Plan


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
    """The condition of type ``kind``, if the status has one."""
    return next((c for c in status.conditions if c.type == kind.value), None)


def fail(plan: Plan, reason: str, message: str, now: datetime) -> Plan:
    """The job fails for good, saying why."""
    status = plan.status
    status.phase = Phase.FAILED
    status.reason, status.message = reason, message
    status.completion_time = status.completion_time or now
    set_condition(status, ConditionType.FAILED, True, reason, message, now)
    set_condition(status, ConditionType.TRAINER_RUNNING, False, reason, message, now)
    return plan


def reject(plan: Plan, message: str, now: datetime) -> Plan:
    """The API server refused to create or change a child: the job fails with its answer."""
    return fail(plan, "ChildRejected", message, now)


def quota_exceeded(status: api.GRPOJobStatus, message: str, now: datetime) -> None:
    """A child would exceed a ResourceQuota: the job keeps its phase and says why it waits."""
    set_condition(status, ConditionType.QUOTA_EXCEEDED, True, "QuotaExceeded", message, now)


def quota_available(status: api.GRPOJobStatus, now: datetime) -> None:
    """Every child of the pass fitted: a QuotaExceeded condition that was True turns False."""
    waited = condition(status, ConditionType.QUOTA_EXCEEDED)
    if waited is not None and waited.status == "True":
        set_condition(status, ConditionType.QUOTA_EXCEEDED, False, "QuotaAvailable", "the children fit the quota", now)
