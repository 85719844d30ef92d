"""Which Events a change of the status posts."""

from __future__ import annotations

from grpojob_api import v1alpha1 as api
from grpojob_api.v1alpha1 import ConditionType, Phase
from grpojob_operator.plan.actions import Event
from grpojob_operator.plan.conditions import condition


def transition_events(old: api.GRPOJobStatus, new: api.GRPOJobStatus) -> list[Event]:
    """An Event when a run ends, breaks or is paused: the job succeeded or failed (``Phase<phase>``), the
    trainer failed and is retried (a Warning ``TrainerFailed``; a Normal ``TrainerPreempted`` when its pod was
    told to stop), the job was suspended or resumed.

    Each Event is an API write, and the way to Running (Initializing, the head ready, the endpoints, the
    trainer) is in the status already, one condition each with its lastTransitionTime; so that way posts
    none, and a job reaches Running within its write budget (tests/integration/operator/test_writes.py).
    A Warning ``QuotaExceeded`` when a ResourceQuota starts holding the job back, and ``GracePeriodTooShort`` when
    the trainer's grace period is found shorter than what a stop needs."""
    return [*_run_events(old, new), *quota_events(old, new), *grace_period_events(old, new)]


def _run_events(old: api.GRPOJobStatus, new: api.GRPOJobStatus) -> list[Event]:
    events = stall_events(old, new)
    if new.attempt > old.attempt > 0:  # an attempt failed, whatever the phase (a retry may stay Initializing)
        trainer = condition(new, ConditionType.TRAINER_RUNNING)
        message = trainer.message if trainer else f"retrying (attempt {new.attempt})"
        if new.preemptions > old.preemptions:  # told to stop, its step checkpointed: no failure of its own
            return [*events, Event("Normal", "TrainerPreempted", message)]
        return [*events, Event("Warning", "TrainerFailed", message)]
    if old.phase == new.phase:
        return events
    message = f"phase {old.phase.value} → {new.phase.value}" + (f": {new.message}" if new.message else "")
    if new.phase == Phase.FAILED:
        return [*events, Event("Warning", "PhaseFailed", message)]
    if new.phase in (Phase.SUCCEEDED, Phase.SUSPENDED) or (new.phase == Phase.QUEUED and old.phase != Phase.PENDING):
        return [Event("Normal", f"Phase{new.phase.value}", message)]
    if old.phase in (Phase.SUSPENDED, Phase.QUEUED):
        return [Event("Normal", "Resumed", f"phase {old.phase.value} → {new.phase.value}")]
    return events


def stall_events(old: api.GRPOJobStatus, new: api.GRPOJobStatus) -> list[Event]:
    """A Warning when the attempt has just been found stalled (condition Stalled turned True)."""
    stalled, before = condition(new, ConditionType.STALLED), condition(old, ConditionType.STALLED)
    if stalled is None or stalled.status != "True" or (before is not None and before.status == "True"):
        return []
    return [Event("Warning", "NoProgress", stalled.message)]


def quota_events(old: api.GRPOJobStatus, new: api.GRPOJobStatus) -> list[Event]:
    """A Warning when a ResourceQuota has just started holding the job back (QuotaExceeded turned True)."""
    waiting, before = condition(new, ConditionType.QUOTA_EXCEEDED), condition(old, ConditionType.QUOTA_EXCEEDED)
    if waiting is None or waiting.status != "True" or (before is not None and before.status == "True"):
        return []
    return [Event("Warning", "QuotaExceeded", waiting.message)]


def grace_period_events(old: api.GRPOJobStatus, new: api.GRPOJobStatus) -> list[Event]:
    """A Warning when the grace period the user set has just been found too short (GracePeriodTooShort turned
    True)."""
    short, before = (
        condition(new, ConditionType.GRACE_PERIOD_TOO_SHORT),
        condition(old, ConditionType.GRACE_PERIOD_TOO_SHORT),
    )
    if short is None or short.status != "True" or (before is not None and before.status == "True"):
        return []
    return [Event("Warning", "GracePeriodTooShort", short.message)]
