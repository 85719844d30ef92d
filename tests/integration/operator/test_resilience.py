"""The operator can die at any point, the head pod can be replaced, and the job can be suspended."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .conftest import eventually, job_manifest

pytestmark = pytest.mark.integration

EXITED_AFTER_A_WRITE = 3
"""The exit status of an operator run with GRPOJOB_EXIT_AFTER_WRITES once it made its writes."""


def test_an_operator_killed_after_every_single_write_never_duplicates_or_orphans_a_child(operator, jobs):
    operator.stop()
    jobs.create(job_manifest("crashy-operator"))
    restarts = 0
    while jobs.status("crashy-operator").get("phase") != "Running":
        # Each run makes exactly one API write (a child or the status), then dies as if SIGKILLed.
        operator.start(GRPOJOB_EXIT_AFTER_WRITES="1")
        try:
            code = operator.wait_exit(60)
        except subprocess.TimeoutExpired:  # nothing left to write: the job must be Running already
            operator.kill()
            assert jobs.status("crashy-operator").get("phase") == "Running", operator.log()[-3000:]
            break
        assert code == EXITED_AFTER_A_WRITE, f"the operator crashed (exit {code}):\n{operator.log()[-3000:]}"
        restarts += 1
        assert restarts < 40, operator.log()[-3000:]
    assert restarts >= 10, "every creation step should have been interrupted"

    operator.start()
    jobs.wait_phase("crashy-operator", "Running")
    children = jobs.children("crashy-operator")
    assert children["RayCluster"] == ["crashy-operator"]
    assert children["Job"] == ["crashy-operator-trainer"]
    assert children["Deployment"] == ["crashy-operator-env-arithmetic"]
    assert children["ConfigMap"] == ["crashy-operator-config", "crashy-operator-endpoints"]
    assert len(jobs.trainer_pods("crashy-operator")) == 1
    assert jobs.status("crashy-operator")["attempt"] == 1


def test_a_replaced_head_pod_is_published_in_the_endpoints(operator, jobs):
    jobs.create(job_manifest("headless"))
    jobs.wait_phase("headless", "Running")
    (head,) = jobs.pods("ray.io/cluster=headless,ray.io/node-type=head")
    old_ip = head.status.pod_ip
    assert jobs.config_map("headless-endpoints")["RAY_HEAD_POD_IP"] == old_ip
    jobs.core.delete_namespaced_pod(head.metadata.name, jobs.namespace)

    def new_head_published() -> bool:
        heads = [p for p in jobs.pods("ray.io/cluster=headless,ray.io/node-type=head") if p.status.pod_ip]
        current = jobs.config_map("headless-endpoints")["RAY_HEAD_POD_IP"]
        return any(p.metadata.name != head.metadata.name and p.status.pod_ip == current for p in heads)

    eventually(new_head_published, "the new head pod's IP in the endpoints", 60)
    assert jobs.status("headless")["gcsAddress"].startswith("headless-head-svc.")


def test_a_child_deleted_between_the_operators_read_and_its_write_is_recreated_not_a_failure(operator, jobs):
    operator.stop()
    operator.program = [str(Path(__file__).with_name("stale_cache_operator.py"))]
    operator.start()
    jobs.create(job_manifest("stale"))
    jobs.wait_phase("stale", "Running")
    head_ip = jobs.config_map("stale-endpoints")["RAY_HEAD_POD_IP"]
    # A hand edit of the endpoints: the operator puts them right with a merge patch, and the launcher
    # deletes the ConfigMap just before that patch.
    patch = {"data": {"RAY_HEAD_POD_IP": "10.9.9.9"}}
    jobs.core.patch_namespaced_config_map("stale-endpoints", jobs.namespace, patch)

    def endpoints_restored() -> bool:
        endpoints = jobs.config_map("stale-endpoints")
        return "stale-cache fault" in operator.log() and (endpoints or {}).get("RAY_HEAD_POD_IP") == head_ip

    eventually(endpoints_restored, "the endpoints recreated with the head's IP", 60)
    log = operator.log()
    assert "stale-cache fault: deleted ConfigMap stale-endpoints" in log, log[-3000:]
    assert "the caches were behind" in log, log[-3000:]
    status = jobs.status("stale")
    assert status["phase"] == "Running", status
    assert not any(c["type"] == "Failed" and c["status"] == "True" for c in status["conditions"]), status
    assert not [reason for reason, _ in jobs.events("stale") if reason == "PhaseFailed"]


def test_suspend_removes_the_workload_and_resume_starts_it_again(operator, jobs):
    jobs.create(job_manifest("pausable"))
    jobs.wait_phase("pausable", "Running")
    jobs.patch_spec("pausable", {"suspend": True})
    jobs.wait_phase("pausable", "Suspended")

    def workload_gone() -> bool:
        children = jobs.children("pausable")
        return not (children["RayCluster"] or children["Deployment"] or children["Job"] or children["Pod"])

    eventually(workload_gone, "the RayCluster, environments and trainer to be removed", 60)
    assert jobs.get("pausable")["spec"]["suspend"] is True

    # While suspended the spec may change (Kueue resizes jobs); while running it may not.
    jobs.patch_spec("pausable", {"grpo": {"maxSteps": 7}, "suspend": False})
    jobs.wait_phase("pausable", "Running", timeout=60)
    assert jobs.children("pausable")["RayCluster"] == ["pausable"]
    with pytest.raises(Exception, match="immutable"):
        jobs.patch_spec("pausable", {"grpo": {"maxSteps": 9}})
