"""`grpojob download` and `grpojob download-model`: a job's download step, reporting what it fetched."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from grpojob_api import hub
from grpojob_trainer.errors import UsageError

log = logging.getLogger("grpojob")


def download_step(model_id: str, revision: str | None, cache: Path, termination_log: Path | None) -> int:
    """`grpojob download-model`: download one model. Prints (and writes to ``termination_log``) `{"commit": …}`
    as JSON, or the reason it failed."""
    import json

    from grpojob_trainer.models.hub import HubError, download_model

    try:
        snapshot = download_model(model_id, revision, cache)
    except HubError as error:
        report, code = {"reason": error.reason, "message": str(error)}, 1
    else:
        report, code = {"commit": snapshot.commit, "path": str(snapshot.path)}, 0
    text = json.dumps(report)
    print(text, flush=True)
    if termination_log is not None:
        termination_log.write_text(text)
    return code


def download_repos(arguments: list[str], cache: Path, termination_log: Path | None) -> int:
    """`grpojob download`: the download step of a job, one repository (`grpojob_api.hub.HubRepo`, JSON) per
    argument, each with its own revision, token and offline switch. Prints (and writes to ``termination_log``,
    where the operator reads it) the commit of each, in order, as a `DownloadReport`; or why the first that
    failed did."""
    from grpojob_trainer.models.hub import HubError, download

    try:
        repos = [hub.HubRepo.parse(argument) for argument in arguments]
    except ValueError as error:
        raise UsageError(str(error)) from None
    commits = []
    try:
        for repo in repos:
            token = os.environ.get(repo.token_env) if repo.token_env else None
            if repo.token_env and not token and not repo.offline:
                raise HubError("HubTokenMissing", f"{repo.field}.tokenSecret: {repo.token_env} is empty")
            snapshot = download(
                repo.id,
                repo.revision,
                cache,
                repo_type=repo.kind,
                offline=repo.offline,
                token=token,
                files=repo.files,
                field=repo.field,
            )
            log.info("%s %s at revision %s: commit %s", repo.kind, repo.id, repo.revision, snapshot.commit)
            commits.append(snapshot.commit)
    except HubError as error:
        report, code = hub.DownloadReport(reason=error.reason, message=str(error)), 1
    else:
        report, code = hub.DownloadReport(commits=commits), 0
    print(report.text(), flush=True)
    if termination_log is not None:
        termination_log.write_text(report.text())
    return code
