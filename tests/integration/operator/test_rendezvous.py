"""A retried attempt's pods never use the failed attempt's endpoints: on the real control plane, the
operator marks each pod with its attempt and rewrites `<job>-endpoints` for the retry, and a pod of
attempt 2 handed attempt 1's copy refuses it and re-reads the live ConfigMap (as the kubelet projects it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpojob_api import endpoints
from grpojob_trainer.cluster.rendezvous import current_endpoints

from .conftest import job_manifest

pytestmark = pytest.mark.integration


def literal_env(pod) -> dict[str, str]:
    (container,) = pod.spec.containers
    return {var.name: var.value for var in container.env if var.value is not None}


def test_a_retried_trainer_refuses_the_failed_attempts_endpoints_and_reads_its_own(operator, jobs, tmp_path: Path):
    jobs.create(job_manifest("stale", backoffLimit=1))
    jobs.wait_phase("stale", "Running")
    first = jobs.wait_trainer_pod("stale", attempt=1)
    assert literal_env(first)[endpoints.GRPOJOB_POD_ATTEMPT] == "1"
    attempt_one = jobs.config_map("stale-endpoints")  # what attempt 1's pods were given
    assert attempt_one[endpoints.GRPOJOB_ATTEMPT] == "1"
    jobs.exit_pod(first.metadata.name, 1)

    second = jobs.wait_trainer_pod("stale", attempt=2)
    own = literal_env(second)
    assert own[endpoints.GRPOJOB_POD_ATTEMPT] == "2"
    mounted = tmp_path / "endpoints"

    def kubelet_sync(_: float) -> None:
        mounted.mkdir(exist_ok=True)
        for key, value in jobs.config_map("stale-endpoints").items():
            (mounted / key).write_text(value)

    # The pod of attempt 2 started with attempt 1's copy in its environment: refused, then re-read.
    found = current_endpoints({**attempt_one, **own}, mounted, sleep=kubelet_sync, timeout_s=60, poll_s=1)
    assert found.attempt == 2 and found.job_name == "stale"
    # The environment servers were made during attempt 1 and read endpoints of attempt 2: newer, so used.
    (environment,) = jobs.pods("grpo.dev/job=stale,grpo.dev/component=environment")
    environ = {**jobs.config_map("stale-endpoints"), **literal_env(environment)}
    assert current_endpoints(environ, mounted, sleep=pytest.fail).attempt == 2
