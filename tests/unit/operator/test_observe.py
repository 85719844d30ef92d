"""The summaries of watched children hold what the plan reads, and nothing more: a change of anything
else leaves the summary equal, so the pass it would wake is skipped. A container that died says why in the
job's status, in one line."""

from __future__ import annotations

from grpojob_api.v1alpha1 import ConditionType
from grpojob_operator.observe import TrainerJobInfo, summarize
from grpojob_operator.plan.conditions import condition

from .conftest import job_body
from .plan.conftest import base_children, run, with_endpoints


def raycluster(ready_workers: int, head_ready: bool = True) -> dict:
    return {
        "metadata": {"name": "demo"},
        "spec": {"workerGroupSpecs": [{"groupName": "policy", "replicas": 3}]},
        "status": {
            "readyWorkerReplicas": ready_workers,
            "conditions": [{"type": "HeadPodReady", "status": "True" if head_ready else "False"}],
        },
    }


def test_kuberays_status_writes_leave_the_raycluster_summary_equal():
    """The head's readiness is read from the head pod, so neither a worker starting nor KubeRay's copy of the
    head's readiness wakes a pass."""
    assert summarize("RayCluster", raycluster(0)) == summarize("RayCluster", raycluster(3))
    assert summarize("RayCluster", raycluster(3)) == summarize("RayCluster", raycluster(3, head_ready=False))


# What a container that died leaves in its pod's status: the end of its log (FallbackToLogsOnError) or the
# one line it wrote to /dev/termination-log.
TRACEBACK_TAIL = """\
step 3: mean reward 0.12
Traceback (most recent call last):
  File "/app/grpojob_trainer/cli.py", line 200, in main
    raise RuntimeError("the dataset has no rows")
RuntimeError: the dataset has no rows
"""


def pod_body(name: str, component: str, container: dict, attempt: int = 1) -> dict:
    """A pod of job `demo` with one container status ``container``, as the API server returns it."""
    return {
        "metadata": {
            "name": name,
            "creationTimestamp": "2026-11-30T09:00:00Z",
            "labels": {"grpo.dev/job": "demo", "grpo.dev/component": component, "grpo.dev/attempt": str(attempt)},
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-30T09:00:00Z"}],
            "containerStatuses": [container],
        },
    }


def test_a_failed_trainers_job_says_why_its_container_died_in_one_line():
    trainer = {
        "name": "trainer",
        "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": TRACEBACK_TAIL}},
    }
    children = with_endpoints(base_children())
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 1, False, True, "BackoffLimitExceeded", False)}
    children["Pod"]["demo-trainer-a"] = summarize("Pod", pod_body("demo-trainer-a", "trainer", trainer))
    plan = run(job_body(status={"attempt": 1, "phase": "Running"}), children)
    message = condition(plan.status, ConditionType.TRAINER_RUNNING).message
    assert "container trainer exited with code 1 (Error: RuntimeError: the dataset has no rows)" in message
    assert "\n" not in message and "Traceback" not in message


def test_a_termination_message_is_quoted_up_to_a_bounded_length():
    long = {"name": "trainer", "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "x" * 5000}}}
    [(_, _, detail)] = summarize("Pod", pod_body("demo-trainer-a", "trainer", long)).terminated
    assert detail.startswith("Error: xxx") and len(detail) <= 320


def test_an_environment_pod_that_keeps_crashing_fails_the_job_with_the_reason_of_its_last_crash():
    crashing = {
        "name": "environment",
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s restarting failed container"}},
        "lastState": {
            "terminated": {"exitCode": 2, "reason": "Error", "message": "error: unknown environment mathh\n"}
        },
    }
    children = with_endpoints(base_children())
    children["Pod"]["demo-env-math-x"] = summarize("Pod", pod_body("demo-env-math-x", "environment", crashing))
    plan = run(job_body(status={"attempt": 1, "phase": "Initializing"}), children)
    assert plan.status.phase == "Failed" and plan.status.reason == "CrashLoopBackOff"
    assert plan.status.message == (
        "pod demo-env-math-x container environment is in CrashLoopBackOff: back-off 5m0s restarting failed "
        "container; its last run exited with code 2 (Error: error: unknown environment mathh)"
    )


def environment_pod(container: dict) -> dict:
    """A pod of environment `math` of job `demo` with one container status ``container``."""
    body = pod_body("demo-env-math-7f9c", "environment", container)
    body["metadata"]["labels"]["grpo.dev/environment"] = "math"
    return body


def test_a_crashed_server_keeps_the_last_lines_of_its_log_whether_it_waits_to_restart_or_runs_again():
    crash = {"exitCode": 1, "reason": "Error", "message": "\n".join(f"line {i}" for i in range(80)) + "\n"}
    waiting = {
        "name": "nemo-gym",
        "restartCount": 3,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
        "lastState": {"terminated": crash},
    }
    running = {"name": "nemo-gym", "restartCount": 4, "state": {"running": {}}, "lastState": {"terminated": crash}}
    pod = summarize("Pod", environment_pod(waiting))
    assert pod.environment == "math"
    assert pod.crashed == (("nemo-gym", "exit code 1, Error", "line 75 | line 76 | line 77 | line 78 | line 79"),)
    assert summarize("Pod", environment_pod(running)).crashed == pod.crashed
    just_ended = {"name": "nemo-gym", "state": {"terminated": crash}, "lastState": {"terminated": {"exitCode": 2}}}
    assert summarize("Pod", environment_pod(just_ended)).crashed == pod.crashed  # its current run, not the one before


def test_a_long_log_tail_keeps_its_end_and_a_container_that_never_stopped_has_none():
    long = {"exitCode": 137, "reason": "OOMKilled", "message": "x" * 2000 + " killed"}
    crashed = {"name": "nemo-gym", "state": {"running": {}}, "lastState": {"terminated": long}}
    [(_, how, tail)] = summarize("Pod", environment_pod(crashed)).crashed
    assert how == "exit code 137, OOMKilled" and len(tail) == 500 and tail.startswith("…x") and tail.endswith(" killed")
    assert summarize("Pod", environment_pod({"name": "nemo-gym", "state": {"running": {}}})).crashed == ()
