"""The GRPOJob state machine, in one place: from the job and what is observed of its children to the
actions to take and the status to write. Pure: no API calls, no clock (``now`` is an argument), no memo
(the config's renderer is handed in).

    Pending ─▶ Initializing ─▶ Running ─▶ Succeeded
                   │   ▲          │
                   │   └─ retry ──┤ (trainer failed or stalled, attempt ≤ backoffLimit)
                   ▼              ▼
                 Failed ◀──── Failed (InvalidSpec, DeadlineExceeded, a stuck pod, BackoffLimitExceeded, CannotRun)
    any non-terminal phase ◀─▶ Suspended (spec.suspend)
    any non-terminal phase ◀─▶ Queued (label kueue.x-k8s.io/queue-name: until Kueue admits the job's
                               Workload, and again when Kueue evicts or preempts it)

A running attempt whose step has not advanced for `spec.progressDeadlineSeconds` (counted from its
trainer's start, then from each new step) is stalled: condition Stalled, and it is retried as failed.

A stage that raises (a builder refusing a spec the API admitted: a bug) raises `BuildError` naming the stage;
the job's loop retries it with backoff, and after `OperatorSettings.build_tries` passes in a row the job fails
with reason BuildFailed (`build_failed`), which releases its children as any failed job does.

A pass walks `STAGES` in order, as KubeRay's RayCluster controller walks its reconcile functions; each
stage adds to the plan and says whether the next one runs. Their order is the order of the children:
the NetworkPolicy (before any pod of the job exists); for a hub model, its cache claim and download Job
(nothing else starts before the model is there); then the RayCluster, `<job>-config`, `<job>-generation`
(and the trainer's RBAC) → wait for a Ready head pod with an IP (Ready is KubeRay's
probe of the GCS) and every Ray pod on a node → write `<job>-endpoints` → environment Deployments/Services
and the trainer Job, which read the endpoints with envFrom. Each stage's module says the rest of its part.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import ValidationError

from grpojob_api import v1alpha1 as api
from grpojob_api.admission import describe, parse_job
from grpojob_api.v1alpha1 import Phase
from grpojob_operator.children.trainer import build_config_map
from grpojob_operator.observe import Observed
from grpojob_operator.plan import (
    admission,
    deadlines,
    endpoints,
    environments,
    finished,
    model,
    network_policy,
    ray_cluster,
    suspend,
    tensorboard,
    trainer,
)
from grpojob_operator.plan.actions import Plan
from grpojob_operator.plan.conditions import fail
from grpojob_operator.plan.context import GO_ON, ConfigMapBuilder, Pass, Stage
from grpojob_operator.plan.events import transition_events
from grpojob_operator.settings import OperatorSettings

STAGES: tuple[Stage, ...] = (
    finished.finished,  # a job that has ended: release Kueue's quota, clean up; stops here
    suspend.suspended,  # spec.suspend: delete what runs; stops here
    suspend.resumed,
    deadlines.deadlines,  # spec.activeDeadlineSeconds, a stuck pod
    admission.admission,  # Kueue: nothing runs before it admits the job
    network_policy.network_policy,
    model.model,  # a hub model is downloaded before any pod that loads it
    ray_cluster.ray_cluster,  # and the children that need no address
    tensorboard.tensorboard,
    trainer.reported,  # a trainer that has ended is judged even with the head gone
    ray_cluster.ray_head,  # waits for the head
    endpoints.endpoints,
    environments.environments,
    trainer.trainer,
)


def plan(
    body: dict[str, Any],
    observed: Observed,
    settings: OperatorSettings,
    now: datetime,
    config_map: ConfigMapBuilder = build_config_map,
) -> Plan:
    """Decide the next actions and the new status of the GRPOJob ``body`` (as read from the API)."""
    old = current_status(body)
    status = old.model_copy(deep=True)
    status.observed_generation = body.get("metadata", {}).get("generation")
    result = Plan(status=status)
    try:
        job = parse_job({k: v for k, v in body.items() if k != "status"})
    except ValidationError as error:
        if status.phase != Phase.FAILED:
            fail(result, "InvalidSpec", describe(error), now)
    else:
        pass_ = Pass(job, result, observed, settings, now, config_map)
        for stage in STAGES:
            try:
                go_on = stage(pass_)
            except Exception as error:
                raise BuildError(stage.__name__, error) from error
            if go_on is not GO_ON:
                break
    result.events = transition_events(old, status)
    return result


class BuildError(Exception):
    """A stage of the plan raised: the job's children cannot be built from its spec as it stands."""

    def __init__(self, stage: str, error: Exception) -> None:
        self.stage = stage
        self.error = error
        super().__init__(f"stage {stage}: {_one_line(error)}")


def _one_line(error: Exception) -> str:
    """An exception as one line: its type and message (a pydantic error's parts joined)."""
    if isinstance(error, ValidationError):
        parts = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        return f"{error.title}: {parts}"
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


def build_failed(body: dict[str, Any], error: BuildError, tries: int, now: datetime) -> Plan:
    """The pass after ``tries`` in a row raised ``error``: the job fails with reason BuildFailed (no actions: the
    next pass, of a failed job, releases its children). A job that has ended keeps its verdict."""
    old = current_status(body)
    result = Plan(status=old.model_copy(deep=True))
    if not old.phase.is_terminal():
        message = f"the operator could not build this job's children ({tries} tries): {error}"
        fail(result, "BuildFailed", message, now)
    result.events = transition_events(old, result.status)
    return result


def current_status(body: dict[str, Any]) -> api.GRPOJobStatus:
    """The job's status as written, ignoring fields that are not ours; empty when unreadable."""
    raw = {k: v for k, v in (body.get("status") or {}).items() if k in _STATUS_KEYS}
    try:
        return api.GRPOJobStatus.model_validate(raw)
    except ValidationError:
        return api.GRPOJobStatus()  # a status we cannot read is rebuilt from the children


_STATUS_KEYS = {f.alias or n for n, f in api.GRPOJobStatus.model_fields.items()} | set(api.GRPOJobStatus.model_fields)
