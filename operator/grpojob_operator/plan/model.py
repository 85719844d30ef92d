"""Stage: a hub model (`spec.model.id`) is downloaded before any pod that loads it starts: its cache claim
(unless the spec names one) and the download Job `<job>-model`, whose pod reports the commit it resolved
(kept in `status.modelCommit`; condition ModelReady). A failed download (an unknown id, a missing token)
fails the job with the download's reason (ModelNotFound, ModelAccessDenied, ...)."""

from __future__ import annotations

import json
from typing import Any

from grpojob_api.v1alpha1 import ConditionType, Phase
from grpojob_operator.children.claims import model_cache_claim
from grpojob_operator.children.model import build_model_cache_claim, build_model_download_job
from grpojob_operator.observe import PodInfo, TrainerJobInfo
from grpojob_operator.plan.actions import Create, Delete
from grpojob_operator.plan.conditions import fail, set_condition
from grpojob_operator.plan.context import GO_ON, STOP, Pass


def model(pass_: Pass) -> bool:
    """Go on once the model can be loaded: a path always; a hub id once its download Job has reported the
    commit it resolved. Until then: the cache claim and the download Job, ModelReady saying how far it is."""
    job, plan, status, observed, now = pass_.job, pass_.plan, pass_.status, pass_.observed, pass_.now
    spec = job.spec.model
    if spec.id is None or status.model_commit:
        return GO_ON
    child = pass_.child
    claim = model_cache_claim(job)
    what = f"{spec.id} at revision {spec.revision or 'main'}"

    def downloading() -> bool:
        set_condition(status, ConditionType.MODEL_READY, False, "Downloading", f"downloading {what} into {claim}", now)
        return STOP

    if claim == child.model_cache and not observed.has("PersistentVolumeClaim", claim):
        plan.actions.append(Create(build_model_cache_claim(job)))
    download: TrainerJobInfo | None = observed.get("Job", child.model_download)
    status.phase = Phase.INITIALIZING
    if download is None:
        plan.actions.append(Create(pass_.place(build_model_download_job(job, pass_.settings))))
        return downloading()
    pods = [p for p in observed.pods() if p.component == "model-download" and not p.deleting]
    report = download_report(pods)
    for pod in pods:
        if pod.stuck:  # a missing token Secret (or key) does not appear by waiting
            _, reason, message = pod.stuck[0]
            fail(plan, "ModelDownloadFailed", f"the download of {what} cannot start: {reason}: {message}", now)
            return STOP
    if download.failed:
        reason = str(report.get("reason") or "ModelDownloadFailed")
        message = str(report.get("message") or download.failure_message or "the download Job failed")
        fail(plan, reason if reason.isalnum() else "ModelDownloadFailed", f"{what}: {message}", now)
        return STOP
    if not download.complete:
        return downloading()
    commit = str(report.get("commit") or "")
    if not commit and any(pod.phase not in ("Succeeded", "Failed") for pod in pods):
        # The Pod and Job watches are separate streams: the Job's end may arrive before its pod's.
        return downloading()
    if not commit:  # its pod (and report) is gone: download again (from the cache, so at once)
        if not download.deleting:
            plan.actions.append(Delete("Job", child.model_download, "Foreground"))
        return STOP
    status.model_commit = commit
    message = f"{spec.id} at commit {commit} (revision {spec.revision or 'main'}) in {claim}"
    set_condition(status, ConditionType.MODEL_READY, True, "Downloaded", message, now)
    return GO_ON


def download_report(pods: list[PodInfo]) -> dict[str, Any]:
    """The download pod's report (its termination message: JSON), or {} when there is none."""
    for pod in pods:
        if pod.termination_message:
            try:
                report = json.loads(pod.termination_message)
            except json.JSONDecodeError:
                return {"message": pod.termination_message[-1000:]}
            return report if isinstance(report, dict) else {}
    return {}
