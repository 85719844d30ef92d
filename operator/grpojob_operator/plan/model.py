"""Stage: what the job names by Hugging Face id (a model, `spec.model.id`, and datasets) is downloaded before
any pod that reads it starts: its cache claim (unless the spec names one) and the download Job `<job>-model`,
whose pod reports the commit each repository resolved to (kept in `status.modelCommit` and
`status.datasetCommits`; conditions ModelReady and DatasetReady). A failed download (an unknown id, a missing
token) fails the job with the download's reason (ModelNotFound, DatasetAccessDenied, ...)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from grpojob_api import hub
from grpojob_api.v1alpha1 import ConditionType, GRPOJobStatus, Phase
from grpojob_operator.children.claims import model_cache_claim
from grpojob_operator.children.model import build_model_cache_claim, build_model_download_job
from grpojob_operator.observe import PodInfo, TrainerJobInfo
from grpojob_operator.plan.actions import Create, Delete
from grpojob_operator.plan.conditions import fail, set_condition
from grpojob_operator.plan.context import GO_ON, STOP, Pass


def model(pass_: Pass) -> bool:
    """Go on once everything named by id can be read: at once without any; otherwise once the download Job has
    reported the commit of each. Until then: the cache claim and the download Job, ModelReady (for a hub model)
    and DatasetReady (for hub datasets) saying how far it is."""
    job, plan, status, observed, now = pass_.job, pass_.plan, pass_.status, pass_.observed, pass_.now
    repos = hub.hub_repos(job)
    if downloaded(status, repos):
        return GO_ON
    child = pass_.child
    claim = model_cache_claim(job)
    what = ", ".join(f"{repo.id} at revision {repo.revision}" for repo in repos)

    def downloading() -> bool:
        for kind, condition in _CONDITIONS.items():
            named = [f"{repo.id} at revision {repo.revision}" for repo in repos if repo.kind == kind]
            if named:
                message = f"downloading {', '.join(named)} into {claim}"
                set_condition(status, condition, False, "Downloading", message, now)
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
    commits = report_commits(report, repos)
    if commits is None and any(pod.phase not in ("Succeeded", "Failed") for pod in pods):
        # The Pod and Job watches are separate streams: the Job's end may arrive before its pod's.
        return downloading()
    if commits is None:  # its pod (and report) is gone, or it downloaded another spec's: download again
        if not download.deleting:
            plan.actions.append(Delete("Job", child.model_download, "Foreground"))
        return STOP
    record(status, repos, commits)
    for kind, condition in _CONDITIONS.items():
        done = [(repo, commit) for repo, commit in zip(repos, commits, strict=True) if repo.kind == kind]
        if done:
            said = ", ".join(f"{repo.id} at commit {commit} (revision {repo.revision})" for repo, commit in done)
            set_condition(status, condition, True, "Downloaded", f"{said} in {claim}", now)
    return GO_ON


_CONDITIONS = {"model": ConditionType.MODEL_READY, "dataset": ConditionType.DATASET_READY}


def downloaded(status: GRPOJobStatus, repos: list[hub.HubRepo]) -> bool:
    """Whether the status holds the commit of every one of ``repos``."""
    datasets = status.dataset_commits or {}
    return all(status.model_commit if repo.kind == "model" else datasets.get(repo.key) for repo in repos)


def record(status: GRPOJobStatus, repos: list[hub.HubRepo], commits: list[str]) -> None:
    """Keep each repository's commit in the status: the model's in `modelCommit`, the datasets' in
    `datasetCommits` by `<id>@<revision>`."""
    for repo, commit in zip(repos, commits, strict=True):
        if repo.kind == "model":
            status.model_commit = commit
        else:
            status.dataset_commits = {**(status.dataset_commits or {}), repo.key: commit}


def report_commits(report: dict[str, Any], repos: list[hub.HubRepo]) -> list[str] | None:
    """The commit of each of ``repos`` in the download's ``report``; None where it does not hold them all."""
    try:
        return hub.DownloadReport.model_validate(report).commits_of(repos)
    except ValidationError:
        return None


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
