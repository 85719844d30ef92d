"""`grpojob run`'s environment processes: one per replica, each on its own port, all gone on exit."""

from __future__ import annotations

import httpx

from grpojob_api import v1alpha1 as api
from grpojob_trainer.ray_runtime.local_environments import EnvironmentProcesses


def test_an_environment_with_two_replicas_runs_as_two_servers_with_a_log_each_and_both_stop_on_exit(tmp_path):
    environments = [
        api.EnvironmentSpec.model_validate({"name": "arithmetic", "replicas": 2}),
        api.EnvironmentSpec.model_validate({"name": "lookup"}),
    ]
    processes = EnvironmentProcesses(
        environments,
        policy_base_url="http://127.0.0.1:9/v1",  # only /run calls the policy
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
