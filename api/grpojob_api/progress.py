"""How training progress travels from the trainer to `kubectl get grpojobs`.

The trainer writes `{"step": "12", "meanReward": "0.41"}` into its config's ConfigMap `<job>-config`,
beside the config (`grpojob.yaml`), after every step; the operator copies it into `status.step` and
`status.meanReward` on its next pass. After exporting the model it adds `{"outputModel":
"models/demo/final", "outputModelStep": "100"}` (the path inside the output claim), which the operator
copies into `status.outputModel`. After an evaluation (`spec.evaluation`) it adds `{"lastEvaluation":
"10 0.52", "bestEvaluation": "5 0.61"}` (step and mean reward), which become
`status.lastEvaluation` and `status.bestEvaluation`. Once it has written a checkpoint it adds, with each step's
report, what a stop on notice would need by what it measured: `{"stopSeconds": "185", "checkpointWriteSeconds":
"48.2", "trainingSeconds": "21.5", "checkpointBytes": "14920384512"}`, which becomes `status.checkpointing` and
fits a retry's grace period (`spec.checkpointing.gracePeriodSeconds`). An attempt that stops early on notice (a
preemption, a lost Ray worker) leaves its one line there too, `{"stopped": "2 preempted at step 12; checkpoint
PATH"}` (its attempt first): the same line as the pod's termination message, which goes with a deleted pod.

Why a ConfigMap, and not the trainer patching the GRPOJob status or the operator scraping the
trainer's metrics:
- the status keeps one writer (the operator's reconcile), so a trainer can never race the operator
  or write a phase;
- the trainer's rights are as narrow as Kubernetes RBAC allows: `get`/`update`/`patch` on one
  ConfigMap by name (`resourceNames`), which the operator creates for it (a Role cannot grant
  `create` of one name). It is the config's: the trainer alone reads it, the operator keeps the
  config's key and leaves the report's (`REPORT_KEYS`), and a ConfigMap of its own would be one more
  create per job for the API server;
- the operator already watches the job's ConfigMaps, so it learns of a report without polling and
  without reaching into the pod network (which it may not be allowed to, and which a fake node in
  the tests does not have).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

PREEMPTED = "preempted"
"""How the trainer's termination message begins when it stopped on notice (SIGTERM: an eviction, a node drain,
a preemption) after checkpointing its last completed step: `preempted at step 12; checkpoint PATH`. The operator
retries such an attempt without counting it against `spec.backoffLimit`."""


def preemption_message(where: str) -> str:
    """The trainer's termination message after a preemption: ``where`` is "at step N; checkpoint PATH"."""
    return f"{PREEMPTED} {where}"


def is_preemption(message: str) -> bool:
    """Whether a termination message (or a container's "reason: message") is the trainer's `preemption_message`."""
    return any(part.startswith(f"{PREEMPTED} ") for part in (message, message.partition(": ")[2]))


WORKER_LOST = "was lost"
"""How the trainer's termination message says a Ray worker's node left the cluster mid-run (its pod deleted, its
machine reclaimed): `a policy worker was lost at step 8 (pod P, node IP: its node left the Ray cluster); the
retry resumes from checkpoint PATH`. Like a preemption, such an attempt is retried without counting against
`spec.backoffLimit`. A worker whose process died while its node stayed (out of memory, a crash) "died" instead,
and counts."""

PREEMPTED_EXIT_CODE = 143
"""The trainer's exit code once it stopped on notice (128 + SIGTERM) with its last completed step checkpointed."""
WORKER_LOST_EXIT_CODE = 75
"""The trainer's exit code after a Ray worker's node left the cluster (EX_TEMPFAIL: a retry may succeed)."""
CANNOT_RUN_EXIT_CODE = 78
"""The trainer's exit code when the job cannot run as it is specified or packaged (EX_CONFIG): its image lacks a
module its engine needs, its policy does not fit its GPU. A retry would fail the same way, so the operator fails
the job without one."""
PREEMPTION_EXIT_CODES = (PREEMPTED_EXIT_CODE, WORKER_LOST_EXIT_CODE)
"""Exit codes the trainer Job's pod failure policy names in the Job's Failed condition, which outlives the pod:
the operator tells a preemption by them (and a job that cannot run by `CANNOT_RUN_EXIT_CODE`) when the pod, and
its termination message, are gone (a deleted pod)."""


_MATCHED_EXIT = re.compile(r"exit code (\d+) matching")


def matched_exit_code(job_failure: str) -> int | None:
    """The trainer's exit code that a rule of its Job's pod failure policy matched, as the Job's Failed condition
    message names it (Kubernetes: "Container trainer for pod N/P failed with exit code 143 matching FailJob rule
    at index 1"), or None."""
    found = _MATCHED_EXIT.search(job_failure)
    return int(found.group(1)) if found else None


_WORKER_LOST = re.compile(rf"^an? \w+ worker {WORKER_LOST} at step \d+ ")


def worker_lost_message(role: str, step: int, detail: str, node_gone: bool, then: str) -> str:
    """The trainer's one line after losing the ``role`` worker during ``step``: ``detail`` says where it ran and
    what happened, ``then`` how the run goes on."""
    return f"a {role} worker {WORKER_LOST if node_gone else 'died'} at step {step} ({detail}); {then}"


def is_worker_lost(message: str) -> bool:
    """Whether a termination message (or a container's "reason: message") says a worker's node left the cluster."""
    return any(_WORKER_LOST.match(part) for part in (message, message.partition(": ")[2]))


STEP_KEY = "step"
MEAN_REWARD_KEY = "meanReward"
OUTPUT_MODEL_KEY = "outputModel"
OUTPUT_MODEL_STEP_KEY = "outputModelStep"
LAST_EVALUATION_KEY = "lastEvaluation"
BEST_EVALUATION_KEY = "bestEvaluation"
STOP_SECONDS_KEY = "stopSeconds"
CHECKPOINT_WRITE_SECONDS_KEY = "checkpointWriteSeconds"
TRAINING_SECONDS_KEY = "trainingSeconds"
CHECKPOINT_BYTES_KEY = "checkpointBytes"
STOPPED_KEY = "stopped"
STOP_KEYS = (STOP_SECONDS_KEY, CHECKPOINT_WRITE_SECONDS_KEY, TRAINING_SECONDS_KEY, CHECKPOINT_BYTES_KEY)
REPORT_KEYS = frozenset(
    {
        STEP_KEY,
        MEAN_REWARD_KEY,
        OUTPUT_MODEL_KEY,
        OUTPUT_MODEL_STEP_KEY,
        LAST_EVALUATION_KEY,
        BEST_EVALUATION_KEY,
        *STOP_KEYS,
        STOPPED_KEY,
    }
)
"""The keys of `<job>-config` that the trainer writes."""


@dataclass(frozen=True)
class EvaluationReport:
    step: int
    mean_reward: float


@dataclass(frozen=True)
class StopReport:
    """What a stop on notice needs, as the trainer measured it: ``seconds`` in all (one step's training, the
    checkpoint write in flight, the last step's checkpoint copied out of the policy and written, and a margin),
    from the slowest recent checkpoint write and training phase, and the newest checkpoint's size (None: not
    known)."""

    seconds: int
    write_seconds: float
    training_seconds: float
    checkpoint_bytes: int | None = None


@dataclass(frozen=True)
class ProgressReport:
    step: int
    mean_reward: float | None
    output_model: str | None = None
    """The newest exported model's directory, inside the output claim."""
    output_model_step: int | None = None
    last_evaluation: EvaluationReport | None = None
    best_evaluation: EvaluationReport | None = None
    stop: StopReport | None = None
    """What a stop needs, once the trainer has written a checkpoint (of this attempt or an earlier one)."""


@dataclass(frozen=True)
class StoppedReport:
    """How an attempt stopped early, in the trainer's one line (`preemption_message`, `worker_lost_message`)."""

    attempt: int
    message: str


def stopped_data(report: StoppedReport) -> dict[str, str]:
    """What the trainer writes into `<job>-config` when it stops early: its attempt, then its line."""
    return {STOPPED_KEY: f"{report.attempt} {report.message}"}


def parse_stopped(data: dict[str, str]) -> StoppedReport | None:
    """The early stop ``data`` reports; None when there is none or it cannot be read."""
    attempt, _, message = data.get(STOPPED_KEY, "").partition(" ")
    if not attempt.isdigit() or not message.strip():
        return None
    return StoppedReport(int(attempt), message.strip())


def stop_data(report: StopReport) -> dict[str, str | None]:
    """What the trainer writes into `<job>-config` beside a step's progress once it measured a checkpoint (an
    unknown size as null: a merge patch deletes an earlier attempt's)."""
    size = None if report.checkpoint_bytes is None else str(report.checkpoint_bytes)
    return {
        STOP_SECONDS_KEY: str(report.seconds),
        CHECKPOINT_WRITE_SECONDS_KEY: f"{report.write_seconds:.1f}",
        TRAINING_SECONDS_KEY: f"{report.training_seconds:.1f}",
        CHECKPOINT_BYTES_KEY: size,
    }


def _parse_stop(data: dict[str, str]) -> StopReport | None:
    """The stop report of ``data``; None when absent or unreadable (a size that is unreadable is left out)."""
    try:
        report = StopReport(
            int(data[STOP_SECONDS_KEY]), float(data[CHECKPOINT_WRITE_SECONDS_KEY]), float(data[TRAINING_SECONDS_KEY])
        )
    except (KeyError, ValueError):
        return None
    times = (report.write_seconds, report.training_seconds)
    if report.seconds < 1 or not all(math.isfinite(t) and t >= 0 for t in times):
        return None
    size = data.get(CHECKPOINT_BYTES_KEY) or ""
    return dataclasses.replace(report, checkpoint_bytes=int(size)) if size.isdigit() else report


def output_model_data(path: str, step: int) -> dict[str, str]:
    """What the trainer writes into `<job>-config` after exporting the model of ``step`` to ``path``."""
    return {OUTPUT_MODEL_KEY: path, OUTPUT_MODEL_STEP_KEY: str(step)}


def evaluation_data(last: EvaluationReport, best: EvaluationReport | None) -> dict[str, str]:
    """What the trainer writes into `<job>-config` after an evaluation: the newest and the best (none yet
    after the baseline, which is never the best)."""
    data = {LAST_EVALUATION_KEY: _evaluation_text(last)}
    if best is not None:
        data[BEST_EVALUATION_KEY] = _evaluation_text(best)
    return data


def _evaluation_text(report: EvaluationReport) -> str:
    return f"{report.step} {report.mean_reward:.6g}"


def _parse_evaluation(text: str | None) -> EvaluationReport | None:
    """``"<step> <mean reward>"``; None when absent or unreadable (a non-finite reward included)."""
    if text is None:
        return None
    step, _, reward = text.partition(" ")
    try:
        report = EvaluationReport(int(step), float(reward))
    except ValueError:
        return None
    return report if report.step >= 0 and math.isfinite(report.mean_reward) else None


def progress_data(step: int, mean_reward: float | None) -> dict[str, str]:
    """What the trainer writes into `<job>-config` after a step."""
    data = {STEP_KEY: str(step)}
    if mean_reward is not None and math.isfinite(mean_reward):
        data[MEAN_REWARD_KEY] = f"{mean_reward:.6g}"
    return data


def parse_progress(data: dict[str, str]) -> ProgressReport | None:
    """Read a progress report; None when there is none yet or it cannot be read."""
    try:
        step = int(data[STEP_KEY])
        reward = float(data[MEAN_REWARD_KEY]) if MEAN_REWARD_KEY in data else None
    except (KeyError, ValueError):
        return None
    if step < 0 or (reward is not None and not math.isfinite(reward)):
        return None
    reports = {
        "last_evaluation": _parse_evaluation(data.get(LAST_EVALUATION_KEY)),
        "best_evaluation": _parse_evaluation(data.get(BEST_EVALUATION_KEY)),
        "stop": _parse_stop(data),
    }
    output, output_step = data.get(OUTPUT_MODEL_KEY), data.get(OUTPUT_MODEL_STEP_KEY, "")
    if not output or not output_step.isdigit():
        return ProgressReport(step=step, mean_reward=reward, **reports)
    return ProgressReport(
        step=step, mean_reward=reward, output_model=output, output_model_step=int(output_step), **reports
    )
