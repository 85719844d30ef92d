"""The trainer stages: its progress, its Job per attempt, retries, stalls and the end of the job."""

from __future__ import annotations

from datetime import timedelta

import pytest

from grpojob_api import v1alpha1 as api
from grpojob_operator.observe import TrainerJobInfo
from grpojob_operator.plan.actions import Delete
from grpojob_operator.plan.conditions import condition
from grpojob_operator.plan.context import GO_ON, STOP
from grpojob_operator.plan.trainer import reported, trainer

from ..conftest import job_body
from .conftest import (
    NOW,
    base_children,
    kinds_and_names,
    one_pass,
    pod,
    run,
    running_attempt,
    stalling_job,
    status_of,
    with_endpoints,
    with_report,
)


def test_a_running_trainer_pod_makes_the_job_running_and_progress_reaches_the_status():
    children = with_endpoints(base_children())
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 1, False, False, "", False)}
    children["Pod"]["demo-trainer-x"] = pod("demo-trainer-x", "trainer", attempt=1)
    plan = run(job_body(status={"attempt": 1}), with_report(children, meanReward="0.5", step="4"))
    assert plan.actions == []
    assert plan.status.phase == "Running"
    assert (plan.status.step, plan.status.mean_reward) == (4, 0.5)
    assert plan.events == [], "the way to Running is in the conditions; an Event is one more API write"


def test_the_trainers_evaluations_reach_the_status():
    children = with_endpoints(base_children())
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 1, False, False, "", False)}
    children["Pod"]["demo-trainer-x"] = pod("demo-trainer-x", "trainer", attempt=1)
    with_report(children, bestEvaluation="5 0.61", lastEvaluation="10 0.52", meanReward="0.5", step="11")

    plan = run(job_body(status={"attempt": 1}), children)

    assert plan.status.last_evaluation == api.EvaluationStatus(step=10, mean_reward=0.52)
    assert plan.status.best_evaluation == api.EvaluationStatus(step=5, mean_reward=0.61)
    written = plan.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert written["lastEvaluation"] == {"step": 10, "meanReward": 0.52}, "what the EVAL column reads"


def test_a_trainer_pod_that_ended_before_its_job_is_marked_complete_keeps_the_job_running():
    children = with_endpoints(base_children())
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 1, False, False, "", False)}
    children["Pod"]["demo-trainer-x"] = pod("demo-trainer-x", "trainer", attempt=1, phase="Succeeded", ready=False)
    plan = run(job_body(status={"attempt": 1, "phase": "Running"}), children)
    assert plan.actions == []
    assert plan.status.phase == "Running", "no flap back to Initializing between the pod's exit and the Job's verdict"
    assert plan.status.reason == "TrainerExiting"
    assert not any(e.reason == "PhaseInitializing" for e in plan.events)


def test_a_failed_trainer_is_retried_in_three_passes_that_survive_a_restart_between_them():
    children = with_endpoints(base_children())
    failed = TrainerJobInfo("demo-trainer", 1, False, True, "BackoffLimitExceeded", False)
    children["Job"] = {"demo-trainer": failed}
    children["Pod"]["demo-trainer-a"] = pod(
        "demo-trainer-a", "trainer", attempt=1, phase="Failed", terminated=(("trainer", 1, "Error"),)
    )
    # 1. Record the next attempt (nothing deleted yet).
    first = run(job_body(status={"attempt": 1, "phase": "Running"}), children)
    assert first.status.attempt == 2 and first.actions == []
    assert any(e.reason == "TrainerFailed" and "exited with code 1" in e.message for e in first.events)
    # 2. With attempt 2 recorded, the endpoints announce it and the old Job is deleted, pods first.
    second = run(job_body(status=status_of(first)), children)
    assert kinds_and_names(second) == [("Replace", "ConfigMap", "demo-endpoints"), ("Delete", "Job", "demo-trainer")]
    assert second.actions[0].manifest["data"]["GRPOJOB_ATTEMPT"] == "2"
    assert second.actions[1].propagation == "Foreground"
    children = with_endpoints(children, attempt=2)
    # 3. Job gone but its pod still terminating: wait.
    del children["Job"]
    third = run(job_body(status=status_of(second)), children)
    assert not [a for a in kinds_and_names(third) if a[1] == "Job"]
    # 4. Pod gone: the next attempt starts.
    del children["Pod"]["demo-trainer-a"]
    fourth = run(job_body(status=status_of(third)), children)
    assert kinds_and_names(fourth) == [("Create", "Job", "demo-trainer")]
    assert fourth.actions[0].manifest["metadata"]["labels"]["grpo.dev/attempt"] == "2"


def test_the_last_allowed_failure_fails_the_job_with_the_cause():
    children = with_endpoints(base_children(), attempt=2)
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 2, False, True, "", False)}
    children["Pod"]["demo-trainer-b"] = pod(
        "demo-trainer-b", "trainer", attempt=2, phase="Failed", terminated=(("trainer", 137, "OOMKilled"),)
    )
    plan = run(job_body(status={"attempt": 2, "phase": "Initializing"}), children)  # backoffLimit is 1
    assert plan.status.phase == "Failed" and plan.status.reason == "BackoffLimitExceeded"
    assert "demo-trainer-b" in plan.status.message and "code 137 (OOMKilled)" in plan.status.message
    assert plan.status.completion_time == NOW


def test_a_trainer_that_cannot_run_as_specified_fails_the_job_without_a_retry():
    children = with_endpoints(base_children(), attempt=1)
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 1, False, True, "BackoffLimitExceeded", False)}
    said = "the vLLM engine did not start: ModuleNotFoundError: No module named 'torchvision'"
    children["Pod"]["demo-trainer-a"] = pod(
        "demo-trainer-a", "trainer", attempt=1, phase="Failed", terminated=(("trainer", 78, said),)
    )

    plan = run(job_body(status={"attempt": 1, "phase": "Running"}), children)  # backoffLimit 1: a retry is left

    assert (plan.status.phase, plan.status.reason, plan.status.attempt) == ("Failed", "CannotRun", 1)
    assert said in plan.status.message and "not retried" in plan.status.message
    assert not [a for a in plan.actions if type(a).__name__ == "Create"], "no next attempt"


def test_a_deleted_trainer_pod_that_could_not_run_is_known_by_its_jobs_condition():
    children = with_endpoints(base_children(), attempt=1)
    reason = (
        "Container trainer for pod default/demo-trainer-a failed with exit code 78 matching FailJob rule at index 2"
    )
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 1, False, True, reason, False)}

    plan = run(job_body(status={"attempt": 1, "phase": "Running"}), children)

    assert (plan.status.phase, plan.status.reason) == ("Failed", "CannotRun")


def test_a_preempted_trainer_is_retried_without_counting_against_the_backoff_limit():
    children = with_endpoints(base_children(), attempt=2)
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 2, False, True, "BackoffLimitExceeded", False)}
    said = "Error: preempted at step 7; checkpoint /checkpoints/demo/step_00000007"
    children["Pod"]["demo-trainer-b"] = pod(
        "demo-trainer-b", "trainer", attempt=2, phase="Failed", terminated=(("trainer", 143, said),)
    )

    plan = run(job_body(status={"attempt": 2, "phase": "Running"}), children)  # backoffLimit 1: one failure used

    assert (plan.status.phase, plan.status.attempt, plan.status.preemptions) == ("Initializing", 3, 1)
    running = condition(plan.status, api.ConditionType.TRAINER_RUNNING)
    assert running is not None and running.reason == "TrainerPreempted" and "preempted at step 7" in running.message
    assert [(e.type, e.reason) for e in plan.events] == [("Normal", "TrainerPreempted")]


def test_an_evicted_trainer_whose_pod_is_gone_is_known_by_its_jobs_condition():
    children = with_endpoints(base_children(), attempt=2)
    reason = "Pod default/demo-trainer-b has condition DisruptionTarget matching FailJob rule at index 0"
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 2, False, True, reason, False)}

    plan = run(job_body(status={"attempt": 2, "phase": "Running"}), children)

    assert (plan.status.phase, plan.status.attempt, plan.status.preemptions) == ("Initializing", 3, 1)


def test_a_trainer_that_lost_a_ray_worker_with_its_node_is_retried_as_preempted():
    children = with_endpoints(base_children(), attempt=2)
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 2, False, True, "BackoffLimitExceeded", False)}
    said = (
        "Error: a policy worker was lost at step 8 (pod demo-policy-worker-x7k2p, node 10.244.0.12: its node left "
        "the Ray cluster); the retry resumes from checkpoint /checkpoints/demo/step_00000006"
    )
    children["Pod"]["demo-trainer-b"] = pod(
        "demo-trainer-b", "trainer", attempt=2, phase="Failed", terminated=(("trainer", 1, said),)
    )

    plan = run(job_body(status={"attempt": 2, "phase": "Running"}), children)  # backoffLimit 1: one failure used

    assert (plan.status.phase, plan.status.attempt, plan.status.preemptions) == ("Initializing", 3, 1)
    running = condition(plan.status, api.ConditionType.TRAINER_RUNNING)
    assert running is not None and running.reason == "TrainerPreempted"
    assert "a policy worker was lost at step 8 (pod demo-policy-worker-x7k2p" in running.message
    assert [(e.type, e.reason) for e in plan.events] == [("Normal", "TrainerPreempted")]


@pytest.mark.parametrize("code", [143, 75], ids=["stopped-on-notice", "worker-node-lost"])
def test_a_deleted_trainer_pod_that_exited_as_preempted_is_known_by_its_jobs_condition(code: int):
    children = with_endpoints(base_children(), attempt=2)
    pod_ = "default/demo-trainer-b"  # Kubernetes' words in the Job's Failed condition:
    reason = f"Container trainer for pod {pod_} failed with exit code {code} matching FailJob rule at index 1"
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 2, False, True, reason, False)}

    plan = run(job_body(status={"attempt": 2, "phase": "Running"}), children)  # its pod and message are gone

    assert (plan.status.phase, plan.status.attempt, plan.status.preemptions) == ("Initializing", 3, 1)


def test_a_deleted_trainer_pods_line_reaches_the_status_from_its_report_beside_its_progress():
    line = "preempted at step 7; checkpoint /checkpoints/demo/step_00000007"
    reason = "Container trainer for pod default/demo-trainer-b failed with exit code 143 matching FailJob rule at 1"
    children = with_endpoints(base_children(), attempt=2)
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 2, False, True, reason, False)}
    running_job = job_body(status={"attempt": 2, "phase": "Running"})

    plan = run(running_job, with_report(children, step="7", stopped=f"2 {line}"))
    earlier = run(running_job, with_report(children, step="7", stopped=f"1 {line}"))

    running = condition(plan.status, api.ConditionType.TRAINER_RUNNING)
    assert running is not None and running.reason == "TrainerPreempted"
    assert f"the trainer reported: {line}" in running.message, "the pod, and its termination message, are gone"
    earlier_running = condition(earlier.status, api.ConditionType.TRAINER_RUNNING)
    assert earlier_running is not None and line not in earlier_running.message, "an earlier attempt's line"
    assert "exit code 143" in earlier_running.message


def test_a_trainer_reporting_a_lost_worker_is_preempted_even_when_the_job_names_no_preemption():
    line = (
        "a policy worker was lost at step 8 (pod demo-policy-worker-x7k2p, node 10.244.0.12: its node left the Ray "
        "cluster); the retry resumes from checkpoint /checkpoints/demo/step_00000006"
    )
    children = with_endpoints(base_children(), attempt=2)
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 2, False, True, "BackoffLimitExceeded", False)}

    plan = run(job_body(status={"attempt": 2, "phase": "Running"}), with_report(children, stopped=f"2 {line}"))

    assert (plan.status.phase, plan.status.attempt, plan.status.preemptions) == ("Initializing", 3, 1)


def test_a_trainer_whose_ray_worker_died_on_its_own_counts_against_the_backoff_limit():
    children = with_endpoints(base_children(), attempt=2)
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 2, False, True, "BackoffLimitExceeded", False)}
    said = (
        "Error: a generation worker died at step 8 (pod demo-generation-worker-q9d4s, node 10.244.0.13: its process "
        "died (The actor is dead because its worker process has died.)); the retry resumes from checkpoint "
        "/checkpoints/demo/step_00000006"
    )
    children["Pod"]["demo-trainer-b"] = pod(
        "demo-trainer-b", "trainer", attempt=2, phase="Failed", terminated=(("trainer", 1, said),)
    )

    plan = run(job_body(status={"attempt": 2, "phase": "Running"}), children)  # backoffLimit 1: one failure used

    assert (plan.status.phase, plan.status.reason, plan.status.preemptions) == ("Failed", "BackoffLimitExceeded", 0)
    assert "a generation worker died at step 8" in plan.status.message


def test_failures_after_preemptions_count_only_themselves():
    children = with_endpoints(base_children(), attempt=3)
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 3, False, True, "", False)}
    children["Pod"]["demo-trainer-c"] = pod(
        "demo-trainer-c", "trainer", attempt=3, phase="Failed", terminated=(("trainer", 1, "Error: boom"),)
    )

    retried = run(job_body(status={"attempt": 3, "preemptions": 2, "phase": "Running"}), children)
    failed = run(job_body(status={"attempt": 3, "preemptions": 1, "phase": "Running"}), children)

    assert (retried.status.phase, retried.status.attempt) == ("Initializing", 4), "one failure of two allowed"
    assert failed.status.phase == "Failed" and "failed all 2 attempts" in failed.status.message


def test_a_trainer_that_finishes_while_the_head_is_down_still_ends_the_job():
    children = with_endpoints(base_children(head_ready=False))
    children["Pod"] = {}
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 1, True, False, "", False)}
    plan = run(job_body(status={"attempt": 1, "phase": "Running"}), children)
    assert plan.status.phase == "Succeeded"


def test_a_status_rebuilt_from_scratch_takes_the_attempt_from_the_trainer_job():
    children = with_endpoints(base_children(), attempt=3)
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 3, False, False, "", False)}
    children["Pod"]["demo-trainer-c"] = pod("demo-trainer-c", "trainer", attempt=3)
    plan = run(job_body(), children)
    assert plan.status.attempt == 3 and plan.status.phase == "Running"
    assert not [a for a in plan.actions if isinstance(a, Delete)]


def test_a_trainer_whose_step_does_not_advance_within_the_deadline_fails_its_attempt_as_stalled():
    children = running_attempt("4")
    # The trainer started: the deadline counts from here.
    started = run(stalling_job(), children)
    assert started.status.progress_time == NOW and started.status.phase == "Running"
    # Step 4 was reported 59 s ago: still within the deadline.
    recent = (NOW - timedelta(seconds=59)).isoformat()
    assert run(stalling_job(step=4, progressTime=recent), children).status.phase == "Running"
    # 60 s without a new step: the attempt is stalled and retried, saying why.
    stale = (NOW - timedelta(seconds=60)).isoformat()
    plan = run(stalling_job(step=4, progressTime=stale), children)
    stalled = condition(plan.status, api.ConditionType.STALLED)
    assert stalled is not None and stalled.status == "True" and stalled.reason == "NoProgress"
    assert "step 4 was the last" in stalled.message and "60s (spec.progressDeadlineSeconds)" in stalled.message
    assert plan.status.attempt == 2 and plan.status.phase == "Initializing" and plan.status.progress_time is None
    assert any(e.type == "Warning" and e.reason == "NoProgress" for e in plan.events)
    # The next pass replaces the stalled trainer Job like a failed one.
    again = run({**stalling_job(), "status": status_of(plan)}, children)
    assert ("Delete", "Job", "demo-trainer") in kinds_and_names(again)


def test_a_new_step_is_progress_and_clears_the_stall():
    stale = (NOW - timedelta(seconds=600)).isoformat()
    stalled = {"type": "Stalled", "status": "True", "reason": "NoProgress", "lastTransitionTime": stale}
    plan = run(stalling_job(step=4, progressTime=stale, attempt=2, conditions=[stalled]), running_attempt("5", 2))
    assert plan.status.phase == "Running" and plan.status.attempt == 2
    assert plan.status.progress_time == NOW and plan.status.step == 5
    assert condition(plan.status, api.ConditionType.STALLED).status == "False"


def test_a_stall_on_the_last_allowed_attempt_fails_the_job():
    stale = (NOW - timedelta(seconds=60)).isoformat()
    body = stalling_job(step=4, progressTime=stale, attempt=2)
    body["spec"]["backoffLimit"] = 1
    plan = run(body, running_attempt("4", 2))
    assert plan.status.phase == "Failed" and plan.status.reason == "BackoffLimitExceeded"
    assert "made no progress for 60s" in plan.status.message


def test_without_a_progress_deadline_a_quiet_trainer_runs_on():
    stale = (NOW - timedelta(days=3)).isoformat()
    plan = run(
        job_body(status={"attempt": 1, "phase": "Running", "step": 4, "progressTime": stale}), running_attempt("4")
    )
    assert plan.status.phase == "Running" and condition(plan.status, api.ConditionType.STALLED) is None


def test_the_trainer_stage_creates_the_job_of_the_attempt_and_waits_for_its_pod():
    pass_ = one_pass(job_body(status={"attempt": 1}), with_endpoints(base_children()))
    assert reported(pass_) is GO_ON
    assert trainer(pass_) is STOP
    assert kinds_and_names(pass_.plan) == [("Create", "Job", "demo-trainer")]
    assert pass_.status.phase == api.Phase.INITIALIZING
