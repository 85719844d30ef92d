"""Stages: the trainer. What it reports (its step, mean reward, exported model and what a stop needs, through its
progress ConfigMap) reaches the status; its Job `<job>-trainer` is created once the environments are started, one
attempt at a time. A failed or stalled attempt is retried up to `spec.backoffLimit`: a retry first records
the new attempt in the status, then deletes the old trainer Job with foreground propagation (its pods go
first), then creates the next one, so an operator restarted between any two of those steps neither loses
nor repeats an attempt. A running attempt whose step has not advanced for `spec.progressDeadlineSeconds`
(counted from its trainer's start, then from each new step) is stalled: condition Stalled, and it is
retried as failed."""

from __future__ import annotations

from datetime import datetime, timedelta

from grpojob_api import v1alpha1 as api
from grpojob_api.progress import (
    CANNOT_RUN_EXIT_CODE,
    PREEMPTION_EXIT_CODES,
    is_preemption,
    is_worker_lost,
    matched_exit_code,
    parse_progress,
    parse_stopped,
)
from grpojob_api.v1alpha1 import ConditionType, Phase
from grpojob_operator.children.claims import output_model_status
from grpojob_operator.children.trainer import DISRUPTED, build_trainer_job
from grpojob_operator.observe import ConfigMapInfo, PodInfo, TrainerJobInfo
from grpojob_operator.plan.actions import Create, Delete
from grpojob_operator.plan.conditions import condition, fail, set_condition
from grpojob_operator.plan.context import GO_ON, STOP, Pass
from grpojob_operator.plan.grace_period import check_grace_period, stop_seconds


def reported(pass_: Pass) -> bool:
    """Copy the trainer's progress into the status and take the attempt from its Job (a status rebuilt from
    scratch); say whether the grace period the user set fits a stop. A trainer whose attempt has ended is judged
    at once, even with the Ray head gone: the pass stops there."""
    status = pass_.status
    read_progress(pass_.job, status, pass_.observed.get("ConfigMap", pass_.child.config), pass_.now)
    check_grace_period(pass_.job, status, pass_.now)
    job: TrainerJobInfo | None = pass_.observed.get("Job", pass_.child.trainer)
    if job is None:
        return GO_ON
    status.attempt = max(status.attempt, job.attempt)
    if (job.complete or job.failed) and job.attempt == status.attempt and not job.deleting:
        trainer(pass_)
        return STOP
    return GO_ON


def trainer(pass_: Pass) -> bool:
    """The trainer Job of the current attempt: replace an older attempt's, create it, and follow it to its
    end (Succeeded, or a retry)."""
    plan, status, now = pass_.plan, pass_.status, pass_.now
    child = pass_.child
    job: TrainerJobInfo | None = pass_.observed.get("Job", child.trainer)
    pods = [p for p in pass_.observed.pods() if p.component == "trainer"]

    def waiting(reason: str, message: str) -> bool:
        set_condition(status, ConditionType.TRAINER_RUNNING, False, reason, message, now)
        status.phase = Phase.INITIALIZING
        return STOP

    if job is not None and (job.attempt < status.attempt or job.deleting):
        if not job.deleting:
            plan.actions.append(Delete("Job", child.trainer, "Foreground"))
        return waiting("RestartingTrainer", f"removing attempt {job.attempt} before attempt {status.attempt}")
    if job is None:
        leftovers = [p.name for p in pods if p.attempt is not None and p.attempt < status.attempt]
        if leftovers:
            return waiting(
                "RestartingTrainer", f"waiting for pods of the previous attempt to go: {', '.join(leftovers)}"
            )
        manifest = build_trainer_job(
            pass_.job, pass_.settings, status.attempt, status.model_commit, status.dataset_commits, stop_seconds(status)
        )
        plan.actions.append(Create(pass_.place(manifest)))
        return waiting("TrainerStarting", f"attempt {status.attempt}: waiting for the trainer pod")
    if job.complete:
        status.phase = Phase.SUCCEEDED
        status.reason, status.message = "Completed", f"the trainer finished (attempt {status.attempt})"
        status.completion_time = status.completion_time or now
        set_condition(status, ConditionType.TRAINER_RUNNING, False, "Completed", status.message, now)
        set_condition(status, ConditionType.COMPLETE, True, "Completed", status.message, now)
        return STOP
    if job.failed:
        config = pass_.observed.get("ConfigMap", child.config)
        stopped = parse_stopped(config.as_dict()) if config is not None else None
        said = stopped.message if stopped is not None and stopped.attempt == job.attempt else None
        cause = trainer_failure(job, pods, said)
        if cannot_run(job, pods):
            fail(
                plan,
                "CannotRun",
                f"the trainer cannot run as specified: {cause}; not retried (it would fail the same way)",
                now,
            )
        else:
            retry_or_fail(pass_, cause, preempted=preempted(job, pods, said))
        return STOP
    current = [p for p in pods if p.attempt == status.attempt and not p.deleting]
    running = [p for p in current if p.phase == "Running"]
    exited = [p for p in current if p.phase in ("Succeeded", "Failed")]
    if running:
        status.progress_time = status.progress_time or now  # the deadline counts from the trainer's start
        why = stall(pass_.job, status, now)
        if why is not None:
            set_condition(status, ConditionType.STALLED, True, "NoProgress", why, now)
            retry_or_fail(pass_, why)
            return STOP
    if not (running or exited):
        return waiting("TrainerStarting", f"attempt {status.attempt}: waiting for the trainer pod")
    # A pod that has ended before the Job controller's verdict (complete or failed) keeps the job
    # running, not back to Initializing, until that verdict comes.
    pod = (running or exited)[0]
    if running:
        status.reason, status.message = "TrainerRunning", f"pod {pod.name}"
    else:
        status.reason, status.message = "TrainerExiting", f"pod {pod.name} ended ({pod.phase}); waiting for the Job"
    status.phase = Phase.RUNNING
    set_condition(status, ConditionType.TRAINER_RUNNING, True, status.reason, status.message, now)
    return STOP


def retry_or_fail(pass_: Pass, cause: str, preempted: bool = False) -> None:
    """The current attempt failed: start the next one (the next pass replaces the trainer Job), or fail
    the job when `spec.backoffLimit` retries are used up. A ``preempted`` attempt (its pod told to stop, its
    last step checkpointed; or a Ray worker's node gone) is always retried, and counts against none of them."""
    status, now = pass_.status, pass_.now
    limit = pass_.job.spec.backoff_limit
    failures = status.attempt - status.preemptions
    if preempted:
        message = f"attempt {status.attempt} was preempted: {cause}; retrying (not counted in spec.backoffLimit)"
        status.preemptions += 1
        status.attempt += 1
        status.progress_time = None
        set_condition(status, ConditionType.TRAINER_RUNNING, False, "TrainerPreempted", message, now)
        status.phase = Phase.INITIALIZING
    elif failures < limit + 1:
        retries = f"retry {failures} of spec.backoffLimit's {limit}"
        message = f"attempt {status.attempt} failed: {cause}; retrying ({retries})"
        status.attempt += 1
        status.progress_time = None
        set_condition(status, ConditionType.TRAINER_RUNNING, False, "TrainerFailed", message, now)
        status.phase = Phase.INITIALIZING
    else:
        attempts = "its only attempt" if failures == 1 else f"all {failures} attempts"
        message = f"the trainer failed {attempts} (spec.backoffLimit is {limit}); last: {cause}"
        fail(pass_.plan, "BackoffLimitExceeded", message, now)


def stall(job: api.GRPOJob, status: api.GRPOJobStatus, now: datetime) -> str | None:
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


def preempted(job: TrainerJobInfo, pods: list[PodInfo], stopped: str | None = None) -> bool:
    """Whether the attempt ended because its pod, or a Ray worker's, was told to stop or lost its machine: the
    trainer's own word (its termination message, or the same line it reported beside its progress, ``stopped``:
    preempted once it checkpointed, or a worker whose node left the Ray cluster), or the Job's Failed condition
    naming the pod's disruption or the trainer's exit code for either (which outlive a deleted pod). A worker
    whose process died on a node that stayed is the job's own failure, and counts."""
    ended = [detail for pod in pods if pod.attempt == job.attempt for _, code, detail in pod.terminated if code != 0]
    said = any(is_preemption(detail) or is_worker_lost(detail) for detail in [*ended, stopped or ""])
    return (
        said
        or DISRUPTED["type"] in job.failure_message
        or matched_exit_code(job.failure_message) in PREEMPTION_EXIT_CODES
    )


def cannot_run(job: TrainerJobInfo, pods: list[PodInfo]) -> bool:
    """Whether the attempt's trainer exited with `CANNOT_RUN_EXIT_CODE` (its pod's exit, or the Job's Failed
    condition naming it, which outlives a deleted pod): the job cannot run as it is specified or packaged."""
    codes = [code for pod in pods if pod.attempt == job.attempt for _, code, _ in pod.terminated]
    return CANNOT_RUN_EXIT_CODE in [*codes, matched_exit_code(job.failure_message)]


def trainer_failure(job: TrainerJobInfo, pods: list[PodInfo], stopped: str | None = None) -> str:
    """Why the trainer Job failed: its pod's non-zero exit, else the line the trainer reported when it stopped
    early (``stopped``: its pod deleted, its message with it), else the Job's own message."""
    for pod in pods:
        if pod.attempt == job.attempt:
            for container, code, detail in pod.terminated:
                if code != 0:
                    return f"pod {pod.name} container {container} exited with code {code}" + (
                        f" ({detail})" if detail else ""
                    )
    if stopped:
        return f"the trainer reported: {stopped}"
    return job.failure_message or "the trainer Job failed"


def read_progress(job: api.GRPOJob, status: api.GRPOJobStatus, progress: ConfigMapInfo | None, now: datetime) -> None:
    """Copy the trainer's reported step, mean reward, exported model, evaluations and what a stop needs into the
    status; a new step is progress."""
    report = parse_progress(progress.as_dict()) if progress is not None else None
    if report is None:
        return
    if report.step != status.step:
        status.progress_time = now
        stalled = condition(status, ConditionType.STALLED)
        if stalled is not None and stalled.status == "True":
            set_condition(status, ConditionType.STALLED, False, "Progressing", f"step {report.step}", now)
    status.step, status.mean_reward = report.step, report.mean_reward
    if report.output_model is not None and report.output_model_step is not None:
        status.output_model = output_model_status(job, report.output_model, report.output_model_step)
    if (last := report.last_evaluation) is not None:
        status.last_evaluation = api.EvaluationStatus(step=last.step, mean_reward=last.mean_reward)
    if (best := report.best_evaluation) is not None:
        status.best_evaluation = api.EvaluationStatus(step=best.step, mean_reward=best.mean_reward)
    if (stop := report.stop) is not None:
        status.checkpointing = api.CheckpointingStatus(
            stop_seconds=stop.seconds,
            write_seconds=stop.write_seconds,
            training_seconds=stop.training_seconds,
            bytes=stop.checkpoint_bytes,
        )
