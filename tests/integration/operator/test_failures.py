"""Failures end with a clear reason, retries are counted, and the operator never spins or crashes."""

from __future__ import annotations

import pytest
from kubernetes.client import ApiException

from .conftest import UNPULLABLE_IMAGE, eventually, job_manifest

pytestmark = pytest.mark.integration


def test_a_failed_trainer_is_retried_up_to_backoff_limit_then_the_job_fails(operator, jobs):
    jobs.create(job_manifest("flaky", backoffLimit=1))
    jobs.wait_phase("flaky", "Running")
    first = jobs.wait_trainer_pod("flaky", attempt=1)
    jobs.exit_pod(first.metadata.name, 1)

    # The old attempt's pods are gone before the next attempt starts: never two trainer pods at once.
    def second_attempt_running() -> bool:
        pods = jobs.trainer_pods("flaky")
        attempts = {p.metadata.labels["grpo.dev/attempt"] for p in pods}
        assert len(attempts) <= 1, f"pods of two attempts at once: {[p.metadata.name for p in pods]}"
        return attempts == {"2"} and any(p.status.phase == "Running" for p in pods)

    eventually(second_attempt_running, "attempt 2 to run", 60)
    assert jobs.status("flaky")["attempt"] == 2
    assert jobs.config_map("flaky-endpoints")["GRPOJOB_ATTEMPT"] == "2"
    eventually(
        lambda: any(reason == "TrainerFailed" for reason, _ in jobs.events("flaky")), "a TrainerFailed event", 30
    )

    second = jobs.wait_trainer_pod("flaky", attempt=2)
    jobs.exit_pod(second.metadata.name, 1)
    status = jobs.wait_phase("flaky", "Failed")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert second.metadata.name in failed["message"] and "exited with code 1" in failed["message"]
    assert status["attempt"] == 2


def test_a_preempted_trainer_is_retried_without_using_up_the_backoff_limit(operator, jobs):
    jobs.create(job_manifest("spot", backoffLimit=0))
    jobs.wait_phase("spot", "Running")
    first = jobs.wait_trainer_pod("spot", attempt=1)
    said = "preempted at step 3; checkpoint /checkpoints/spot/step_00000003"
    jobs.exit_pod(first.metadata.name, 143, message=said)  # what the trainer writes once told to stop

    try:
        jobs.wait_trainer_pod("spot", attempt=2)
    except TimeoutError:
        pods = [(p.metadata.name, p.status.container_statuses) for p in jobs.trainer_pods("spot")]
        raise AssertionError(f"{jobs.status('spot')}\n{pods}") from None
    status = jobs.status("spot")
    assert (status["attempt"], status["preemptions"]) == (2, 1)
    eventually(
        lambda: any(reason == "TrainerPreempted" and said in message for reason, message in jobs.events("spot")),
        "a TrainerPreempted event quoting the trainer",
        30,
    )

    second = jobs.wait_trainer_pod("spot", attempt=2)
    jobs.exit_pod(second.metadata.name, 1)  # a failure of its own: backoffLimit 0 allows none
    failed = jobs.wait_phase("spot", "Failed")
    assert failed["reason"] == "BackoffLimitExceeded" and "failed its only attempt" in failed["message"]


def test_a_trainer_that_cannot_run_as_specified_fails_the_job_at_once(operator, jobs):
    jobs.create(job_manifest("no-fit", backoffLimit=3))
    jobs.wait_phase("no-fit", "Running")
    first = jobs.wait_trainer_pod("no-fit", attempt=1)
    said = "the policy does not fit its GPU: it needs 61.0 GiB for micro-batch 8, and 40.2 GiB of the GPU is free"
    jobs.exit_pod(first.metadata.name, 78, message=said)  # what the trainer writes when the job cannot run

    failed = jobs.wait_phase("no-fit", "Failed")
    assert failed["reason"] == "CannotRun" and said in failed["message"]
    assert jobs.status("no-fit")["attempt"] == 1, "no retry: it would fail the same way"


def test_a_pod_stuck_in_image_pull_backoff_fails_the_job_naming_the_pod(operator, jobs):
    manifest = job_manifest("badimage")
    manifest["spec"]["environments"][0]["image"] = UNPULLABLE_IMAGE
    jobs.create(manifest)
    status = jobs.wait_phase("badimage", "Failed", timeout=60)
    assert status["reason"] == "ImagePullBackOff"
    # The failed job's environments are cleaned up at once, so the pod is named only in the message.
    assert status["message"].startswith("pod badimage-env-arithmetic-")
    assert "container environment is in ImagePullBackOff" in status["message"]
    assert UNPULLABLE_IMAGE in status["message"]


def test_a_crash_looping_ray_worker_fails_the_job(operator, jobs):
    jobs.create(job_manifest("crashy"))
    jobs.wait_phase("crashy", "Running")
    (worker,) = jobs.pods("ray.io/cluster=crashy,ray.io/group=policy")
    jobs.core.patch_namespaced_pod(
        worker.metadata.name, jobs.namespace, {"metadata": {"annotations": {"grpojob.dev/kwok-crash": "true"}}}
    )
    status = jobs.wait_phase("crashy", "Failed", timeout=60)
    assert status["reason"] == "CrashLoopBackOff" and worker.metadata.name in status["message"]


def test_an_invalid_spec_is_refused_at_apply_naming_the_field(operator, jobs):
    # The CRD carries the model's cross-field rules (CEL), so nothing reaches the operator to fail later;
    # the operator's own InvalidSpec path (an object stored under an older CRD) is in tests/unit.
    with pytest.raises(ApiException) as refused:
        jobs.create(job_manifest("invalid", generation={"maxModelLen": 512, "maxNewTokens": 512}))
    assert refused.value.status == 422
    assert "spec.generation.maxNewTokens must be smaller than spec.generation.maxModelLen" in refused.value.body
    assert not any(jobs.children("invalid").values())


def test_active_deadline_fails_the_job(operator, jobs):
    jobs.create(job_manifest("slow", activeDeadlineSeconds=3))
    status = jobs.wait_phase("slow", "Failed", timeout=30)
    assert status["reason"] == "DeadlineExceeded"
    assert "activeDeadlineSeconds" in status["message"]
    eventually(lambda: not jobs.children("slow")["RayCluster"], "the RayCluster to be cleaned up", 30)


def test_a_job_bigger_than_the_fleet_waits_and_says_why(operator, jobs):
    jobs.create(job_manifest("huge", generation={"replicas": 40, "gpusPerReplica": 8}))

    def explained() -> bool:
        ready = jobs.condition("huge", "RayClusterReady") or {}
        return "cannot be scheduled" in ready.get("message", "") and "nvidia.com/gpu" in ready["message"]

    eventually(explained, "the scheduler's reason in RayClusterReady", 60)
    assert jobs.status("huge")["phase"] == "Initializing", "capacity may still come: the job waits"


def test_a_child_over_a_resource_quota_waits_saying_why_and_goes_on_once_the_quota_is_raised(operator, jobs):
    # No Service fits: the job's generation Service is refused with 403 "exceeded quota".
    quota = {"metadata": {"name": "services"}, "spec": {"hard": {"count/services": "0"}}}
    jobs.core.create_namespaced_resource_quota(jobs.namespace, quota)
    # Until the quota controller has counted, the API server refuses for another reason ("status unknown").
    eventually(
        lambda: jobs.core.read_namespaced_resource_quota("services", jobs.namespace).status.hard or {},
        "the quota to be counted",
        30,
    )
    jobs.create(job_manifest("quota"))

    def waiting() -> bool:
        found = jobs.condition("quota", "QuotaExceeded") or {}
        return found.get("status") == "True" and "exceeded quota" in found.get("message", "")

    eventually(waiting, "condition QuotaExceeded", 60)
    assert jobs.status("quota")["phase"] == "Initializing", "a quota frees up: the job does not fail"
    assert [reason for reason, _ in jobs.events("quota")].count("QuotaExceeded") == 1

    jobs.core.patch_namespaced_resource_quota("services", jobs.namespace, {"spec": {"hard": {"count/services": "50"}}})
    jobs.wait_phase("quota", "Running", timeout=120)  # the next retry (at most a minute of backoff) fits
    assert jobs.condition("quota", "QuotaExceeded")["status"] == "False"
