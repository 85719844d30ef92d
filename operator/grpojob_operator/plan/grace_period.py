"""The trainer pod's grace period against what a stop needs, as the trainer measured it (`status.checkpointing`).

With `spec.checkpointing.gracePeriodSeconds` unset, the next attempt's trainer pod gets a grace period that fits
the last estimate (`CheckpointSpec.grace_period`). A value the user set is kept; when it is shorter than the
estimate, the condition GracePeriodTooShort says so (with a Warning event as it turns True), and turns False
once the value or the estimate changes so that a stop fits again.
"""

from __future__ import annotations

from datetime import datetime

from grpojob_api import v1alpha1 as api
from grpojob_api.v1alpha1 import ConditionType
from grpojob_operator.plan.conditions import condition, set_condition

FIELD = "spec.checkpointing.gracePeriodSeconds"


def stop_seconds(status: api.GRPOJobStatus) -> int | None:
    """What the trainer last measured a stop to need (None: it has not written a checkpoint yet)."""
    return status.checkpointing.stop_seconds if status.checkpointing is not None else None


def check_grace_period(job: api.GRPOJob, status: api.GRPOJobStatus, now: datetime) -> None:
    """Set GracePeriodTooShort True while the grace period the user asked for is shorter than what a stop needs;
    False once it fits again (no condition for a job whose grace period never fell short)."""
    asked, measured = job.spec.checkpointing.grace_period_seconds, status.checkpointing
    if asked is not None and measured is not None and asked < measured.stop_seconds:
        message = (
            f"{FIELD} is {asked} s, but a stop needs about {measured.stop_seconds} s ({_parts(measured)}); "
            "a preempted trainer may lose its last steps: raise it, or leave it unset for the operator to fit it"
        )
        set_condition(status, ConditionType.GRACE_PERIOD_TOO_SHORT, True, "GracePeriodTooShort", message, now)
        return
    short = condition(status, ConditionType.GRACE_PERIOD_TOO_SHORT)
    if short is not None and short.status == "True":
        fits = "the operator fits it" if asked is None else f"{FIELD} is {asked} s"
        message = f"{fits}; a stop needs about {stop_seconds(status)} s"
        set_condition(status, ConditionType.GRACE_PERIOD_TOO_SHORT, False, "GracePeriodFits", message, now)


def _parts(measured: api.CheckpointingStatus) -> str:
    """What the estimate is made of, as the message shows it."""
    size = f" of {_size(measured.bytes)}" if measured.bytes is not None else ""
    return (
        f"a training phase of {measured.training_seconds:.0f} s and two checkpoint writes{size} "
        f"of {measured.write_seconds:.0f} s each, with a margin"
    )


def _size(size: int) -> str:
    """Bytes as people read them: ``14.9 GB``, ``820 MB``, ``12 kB``."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} B"
