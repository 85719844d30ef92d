"""`grpojob run`'s environment processes: one per replica, each on its own port, all gone on exit; one that
never answers stops the run with one line naming it."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from grpojob_api import v1alpha1 as api
from grpojob_trainer import cli
from grpojob_trainer.errors import EnvironmentNotReady
from grpojob_trainer.local.environment_processes import EnvironmentProcesses


def test_an_environment_with_two_replicas_runs_as_two_servers_with_a_log_each_and_both_stop_on_exit(tmp_path):
    environments = [
        api.EnvironmentSpec.model_validate({"name": "arithmetic", "replicas": 2}),
        api.EnvironmentSpec.model_validate({"name": "lookup"}),
    ]
    processes = EnvironmentProcesses(
        environments,
        policy_base_urls=["http://127.0.0.1:9/v1"],  # only /run calls the policy
        policy_model_name="policy",
        gcs_address="",
        log_dir=tmp_path,
    )

    with processes as urls:
        assert set(urls) == {"arithmetic", "lookup"}
        assert len(urls["arithmetic"]) == 2 and len(set(urls["arithmetic"])) == 2
        assert len(urls["lookup"]) == 1
        for url in [*urls["arithmetic"], *urls["lookup"]]:
            assert httpx.get(url + "/").json() == {"status": "ok"}
        running = list(processes.processes.values())

    assert sorted(p.name for p in tmp_path.glob("*.log")) == ["arithmetic-1.log", "arithmetic.log", "lookup.log"]
    assert len(running) == 3 and all(process.poll() is not None for process in running)


# An environment that accepts connections on its port but never answers: a bare listening socket.
SILENT = "import os, socket, time; s = socket.create_server(('127.0.0.1', int(os.environ['PORT']))); time.sleep(600)"


def silent_environment(log_dir: Path) -> EnvironmentProcesses:
    silent = api.EnvironmentSpec.model_validate({"name": "silent", "command": ["python", "-c", SILENT]})
    return EnvironmentProcesses(
        [silent],
        policy_base_urls=["http://127.0.0.1:9/v1"],
        policy_model_name="policy",
        gcs_address="",
        log_dir=log_dir,
        start_timeout_s=1,
    )


def test_an_environment_that_never_answers_is_named_with_its_url_and_the_time_waited(tmp_path):
    processes = silent_environment(tmp_path)
    with pytest.raises(EnvironmentNotReady) as raised, processes:
        pass
    url = processes.urls["silent"]
    assert re.fullmatch(
        rf"environment silent: GET {url}/ did not answer 200 within \ds; its log: {tmp_path / 'silent.log'}",
        str(raised.value),
    )
    assert processes.processes["silent"].poll() is not None, "stopped"


def test_grpojob_run_reports_an_environment_that_never_answers_in_one_line(tmp_path, monkeypatch, capsys):
    def run_local(*_: object, **__: object) -> int:  # what `grpojob run` does once the engine is up
        with silent_environment(tmp_path):
            return 0

    monkeypatch.setattr(cli, "run_local", run_local)
    assert cli.main(["run", "job.yaml", "--no-progress"]) == 1
    error = capsys.readouterr().err
    assert error.startswith("grpojob: environment silent: GET http://127.0.0.1:") and error.count("\n") == 1
    assert "Traceback" not in error
