"""The state machine, step by step, without a cluster: observed children in, actions and status out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from grpojob_api.admission import parse_job
from grpojob_operator import manifests, state
from grpojob_operator.observe import (
    ConfigMapInfo,
    DeploymentInfo,
    Observed,
    OtherInfo,
    PodInfo,
    RayClusterInfo,
    TrainerJobInfo,
)
from grpojob_operator.settings import OperatorSettings

from .conftest import children_up_to_the_head, job_body

NOW = datetime(2026, 11, 30, 10, 0, 10, tzinfo=UTC)
SETTINGS = OperatorSettings(pod_failure_grace_seconds=60)
JOB = parse_job(job_body())


def pod(name: str, component: str, *, ip: str = "10.0.0.2", attempt: int | None = None, **kw) -> PodInfo:
    base = dict(
        phase="Running", ready=True, ip=ip, deleting=False, created=NOW - timedelta(seconds=5), ready_since=None
    )
    base.update(kw)
    return PodInfo(name=name, component=component, attempt=attempt, **base)


def base_children(head_ready: bool = True, head_ip: str = "10.0.0.2") -> dict:
    return children_up_to_the_head(JOB, pod("demo-head", "ray-head", ip=head_ip), head_ready)


def with_endpoints(children: dict, ip: str = "10.0.0.2", attempt: int = 1) -> dict:
    data = manifests.endpoints_data(JOB, SETTINGS, ip, attempt)
    children["ConfigMap"]["demo-endpoints"] = ConfigMapInfo("demo-endpoints", tuple(sorted(data.items())))
    children["Deployment"] = {"demo-env-math": DeploymentInfo("demo-env-math", 1)}
    children["Service"]["demo-env-math"] = OtherInfo("demo-env-math", False)
    return children


def kinds_and_names(plan: state.Plan) -> list[tuple[str, str, str]]:
    out = []
    for action in plan.actions:
        if isinstance(action, (state.Create, state.Replace)):
            out.append((type(action).__name__, action.manifest["kind"], action.manifest["metadata"]["name"]))
        elif isinstance(action, state.Delete):
            out.append(("Delete", action.kind, action.name))
    return out


def run(body: dict, children: dict) -> state.Plan:
    return state.plan(body, Observed(children), SETTINGS, NOW)


def status_of(plan: state.Plan) -> dict:
    return plan.status.model_dump(mode="json", by_alias=True)


def test_a_new_job_gets_its_raycluster_and_config_but_no_endpoints_before_the_head_is_ready():
    plan = run(job_body(), {})
    assert kinds_and_names(plan) == [
        ("Create", "NetworkPolicy", "demo-network"),  # before any pod of the job exists
        ("Create", "RayCluster", "demo"),
        ("Create", "ConfigMap", "demo-config"),
        ("Create", "Service", "demo-generation"),
        ("Create", "ConfigMap", "demo-progress"),
        ("Create", "ServiceAccount", "demo-trainer"),
        ("Create", "Role", "demo-trainer"),
        ("Create", "RoleBinding", "demo-trainer"),
    ]
    assert plan.status.phase == "Initializing"
    assert plan.status.start_time == NOW
    ready = state.condition(plan.status, state.ConditionType.RAY_CLUSTER_READY)
    assert ready is not None and ready.status == "False"


def test_a_ready_head_publishes_endpoints_before_environments_and_the_trainer():
    plan = run(job_body(), base_children())
    assert kinds_and_names(plan) == [
        ("Create", "ConfigMap", "demo-endpoints"),
        ("Create", "Deployment", "demo-env-math"),
        ("Create", "Service", "demo-env-math"),
        ("Create", "Job", "demo-trainer"),
    ]
    endpoints = plan.actions[0].manifest
    assert endpoints["data"]["RAY_HEAD_POD_IP"] == "10.0.0.2"
    assert plan.status.gcs_address == "demo-head-svc.team-a.svc.cluster.local:6379"
    assert plan.status.attempt == 1


def test_head_pod_ready_condition_alone_is_not_enough_without_a_head_pod_ip():
    children = base_children()
    children["Pod"] = {"demo-head": pod("demo-head", "ray-head", ip=None)}  # type: ignore[arg-type]
    assert not any(a for a in kinds_and_names(run(job_body(), children)) if a[2] == "demo-endpoints")


def test_a_replaced_head_pod_rewrites_the_endpoints():
    children = with_endpoints(base_children(head_ip="10.0.0.9"), ip="10.0.0.2")
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 1, False, False, "", False)}
    plan = run(job_body(status={"attempt": 1, "phase": "Running"}), children)
    replaced = [a for a in plan.actions if isinstance(a, state.Replace)]
    assert len(replaced) == 1 and replaced[0].manifest["data"]["RAY_HEAD_POD_IP"] == "10.0.0.9"


def test_a_running_trainer_pod_makes_the_job_running_and_progress_reaches_the_status():
    children = with_endpoints(base_children())
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 1, False, False, "", False)}
    children["Pod"]["demo-trainer-x"] = pod("demo-trainer-x", "trainer", attempt=1)
    children["ConfigMap"]["demo-progress"] = ConfigMapInfo("demo-progress", (("meanReward", "0.5"), ("step", "4")))
    plan = run(job_body(status={"attempt": 1}), children)
    assert plan.actions == []
    assert plan.status.phase == "Running"
    assert (plan.status.step, plan.status.mean_reward) == (4, 0.5)
    assert plan.events == [], "the way to Running is in the conditions; an Event is one more API write"


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


def test_invalid_spec_fails_once_naming_the_field_and_then_stays_quiet():
    body = job_body()
    body["spec"]["generation"] = {"maxModelLen": 64, "maxNewTokens": 64}
    plan = run(body, {})
    assert plan.actions == []
    assert plan.status.phase == "Failed" and plan.status.reason == "InvalidSpec"
    assert "spec.generation.maxNewTokens" in plan.status.message
    again = run({**body, "status": status_of(plan)}, {})
    assert again.actions == [] and again.events == []
    assert status_of(again) == status_of(plan)


def test_unknown_field_is_reported_with_its_path():
    body = job_body()
    body["spec"]["environments"][0]["replica"] = 2
    plan = run(body, {})
    assert "spec.environments[0].replica" in plan.status.message


def test_a_pod_stuck_in_image_pull_backoff_fails_the_job_only_after_the_grace_period():
    children = base_children(head_ready=False)
    stuck = (("ray-worker", "ImagePullBackOff", 'Back-off pulling image "x"'),)
    children["Pod"]["demo-policy-1"] = pod("demo-policy-1", "policy", ready=False, stuck=stuck, ready_since=NOW)
    assert run(job_body(), children).status.phase == "Initializing"
    later = pod("demo-policy-1", "policy", ready=False, stuck=stuck, ready_since=NOW - timedelta(seconds=61))
    children["Pod"]["demo-policy-1"] = later
    plan = run(job_body(), children)
    assert plan.status.phase == "Failed" and plan.status.reason == "ImagePullBackOff"
    assert (
        plan.status.message
        == 'pod demo-policy-1 container ray-worker is in ImagePullBackOff: Back-off pulling image "x"'
    )


def test_active_deadline_counts_from_the_start_time():
    body = job_body()
    body["spec"]["activeDeadlineSeconds"] = 10
    started = (NOW - timedelta(seconds=9)).isoformat()
    assert run({**body, "status": {"startTime": started}}, {}).status.phase == "Initializing"
    late = (NOW - timedelta(seconds=10)).isoformat()
    assert run({**body, "status": {"startTime": late}}, {}).status.reason == "DeadlineExceeded"


def test_suspend_deletes_the_workload_and_keeps_config():
    children = with_endpoints(base_children())
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 1, False, False, "", False)}
    body = job_body(status={"attempt": 1, "phase": "Running", "startTime": NOW.isoformat()})
    body["spec"]["suspend"] = True
    plan = run(body, children)
    assert sorted(kinds_and_names(plan)) == [
        ("Delete", "ConfigMap", "demo-endpoints"),
        ("Delete", "Deployment", "demo-env-math"),
        ("Delete", "Job", "demo-trainer"),
        ("Delete", "RayCluster", "demo"),
        ("Delete", "Service", "demo-env-math"),
    ]
    assert plan.status.phase == "Suspended" and plan.status.start_time is None


def test_finished_job_cleanup_keeps_the_trainer_job_by_default_and_ttl_deletes_the_job():
    children = with_endpoints(base_children())
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 1, True, False, "", False)}
    done = (NOW - timedelta(seconds=30)).isoformat()
    body = job_body(status={"attempt": 1, "phase": "Succeeded", "completionTime": done})
    plan = run(body, children)
    deleted = {(kind, name) for _, kind, name in kinds_and_names(plan)}
    assert ("RayCluster", "demo") in deleted and ("Deployment", "demo-env-math") in deleted
    assert ("Job", "demo-trainer") not in deleted
    assert not any(isinstance(a, state.DeleteJob) for a in plan.actions)
    body["spec"]["ttlSecondsAfterFinished"] = 30
    assert any(isinstance(a, state.DeleteJob) for a in run(body, children).actions)


def test_condition_transition_time_only_moves_when_the_status_flips():
    plan = run(job_body(), {})
    first = state.condition(plan.status, state.ConditionType.RAY_CLUSTER_READY)
    later = state.plan(job_body(status=status_of(plan)), Observed({}), SETTINGS, NOW + timedelta(seconds=30))
    again = state.condition(later.status, state.ConditionType.RAY_CLUSTER_READY)
    assert first is not None and again is not None
    assert again.last_transition_time == first.last_transition_time
    assert later.events == []


def test_a_trainer_that_finishes_while_the_head_is_down_still_ends_the_job():
    children = with_endpoints(base_children(head_ready=False))
    children["Pod"] = {}
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 1, True, False, "", False)}
    plan = run(job_body(status={"attempt": 1, "phase": "Running"}), children)
    assert plan.status.phase == "Succeeded"


def test_a_raycluster_being_deleted_is_not_a_ready_head():
    children = base_children()
    children["RayCluster"]["demo"] = RayClusterInfo("demo", True, 3, 3, deleting=True)
    plan = run(job_body(), children)
    assert not any(name == "demo-endpoints" for _, _, name in kinds_and_names(plan))
    assert plan.status.phase == "Initializing"


def test_a_head_pod_that_is_not_ready_is_not_published():
    children = base_children()
    children["Pod"] = {"demo-head": pod("demo-head", "ray-head", ready=False)}
    assert not any(name == "demo-endpoints" for _, _, name in kinds_and_names(run(job_body(), children)))


def test_the_config_follows_a_spec_changed_while_suspended():
    children = base_children(head_ready=False)
    children["ConfigMap"]["demo-config"] = ConfigMapInfo("demo-config", (("grpojob.yaml", "old"), ("extra", "x")))
    plan = run(job_body(), children)
    (replace,) = [a for a in plan.actions if isinstance(a, state.Replace)]
    assert replace.manifest["metadata"]["name"] == "demo-config"
    assert replace.stale_keys == ("extra",)


def test_a_status_rebuilt_from_scratch_takes_the_attempt_from_the_trainer_job():
    children = with_endpoints(base_children(), attempt=3)
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 3, False, False, "", False)}
    children["Pod"]["demo-trainer-c"] = pod("demo-trainer-c", "trainer", attempt=3)
    plan = run(job_body(), children)
    assert plan.status.attempt == 3 and plan.status.phase == "Running"
    assert not [a for a in plan.actions if isinstance(a, state.Delete)]


def test_the_vllm_backend_without_gpus_is_refused_naming_the_field():
    body = job_body()
    body["spec"]["generation"] |= {"backend": "vllm", "gpusPerReplica": 0}
    plan = run(body, {})
    assert plan.status.reason == "InvalidSpec" and "spec.generation.backend" in plan.status.message
    assert plan.actions == []
    body["spec"]["generation"]["gpusPerReplica"] = 1
    assert run(body, {}).status.phase == "Initializing"


def test_a_child_the_api_refuses_fails_the_job_with_its_answer():
    plan = state.reject(run(job_body(), {}), "HTTP 422: subPath must not contain '..'", NOW)
    assert plan.status.phase == "Failed" and plan.status.reason == "ChildRejected"
    assert "subPath" in plan.status.message


def test_a_pod_the_scheduler_cannot_place_is_explained_without_failing_the_job():
    children = base_children(head_ready=False)
    children["Pod"] = {
        "demo-head": pod("demo-head", "ray-head", ip=None, phase="Pending", ready=False, unschedulable="0/6 nodes")
    }
    plan = run(job_body(), children)
    ready = state.condition(plan.status, state.ConditionType.RAY_CLUSTER_READY)
    assert plan.status.phase == "Initializing"
    assert ready is not None and ready.message.endswith("pod demo-head cannot be scheduled: 0/6 nodes")


def watched_body(status: dict | None = None, **logging) -> dict:
    body = job_body(status=status)
    body["spec"]["logging"] = {"pvc": {"claimName": "logs"}, "tensorboard": True, **logging}
    return body


def test_tensorboard_starts_with_the_job_before_the_ray_head_is_up():
    plan = run(watched_body(), base_children(head_ready=False))
    created = kinds_and_names(plan)
    assert ("Create", "Deployment", "demo-tensorboard") in created
    assert ("Create", "Service", "demo-tensorboard") in created
    assert not any(name == "demo-tensorboard" for _, _, name in kinds_and_names(run(job_body(), base_children())))


def _with_tensorboard(children: dict) -> dict:
    children.setdefault("Deployment", {})["demo-tensorboard"] = DeploymentInfo("demo-tensorboard", 1)
    children["Service"]["demo-tensorboard"] = OtherInfo("demo-tensorboard", False)
    return children


def test_tensorboard_outlives_the_cluster_of_a_finished_job_unless_the_cleanup_deletes_all():
    children = _with_tensorboard(with_endpoints(base_children()))
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 1, True, False, "", False)}
    status = {"attempt": 1, "phase": "Succeeded", "completionTime": NOW.isoformat()}
    kept = {(kind, name) for _, kind, name in kinds_and_names(run(watched_body(status), children))}
    assert ("RayCluster", "demo") in kept and ("Deployment", "demo-tensorboard") not in kept
    body = watched_body(status)
    body["spec"]["cleanupPolicy"] = "DeleteAll"
    deleted = {(kind, name) for _, kind, name in kinds_and_names(run(body, children))}
    assert {("Deployment", "demo-tensorboard"), ("Service", "demo-tensorboard")} <= deleted


def test_turning_tensorboard_off_removes_it():
    children = _with_tensorboard(base_children())
    body = watched_body(tensorboard=False)
    deleted = [(kind, name) for verb, kind, name in kinds_and_names(run(body, children)) if verb == "Delete"]
    assert deleted == [("Deployment", "demo-tensorboard"), ("Service", "demo-tensorboard")]


def _running_attempt(step: str, attempt: int = 1) -> dict:
    children = with_endpoints(base_children(), attempt=attempt)
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", attempt, False, False, "", False)}
    children["Pod"]["demo-trainer-x"] = pod("demo-trainer-x", "trainer", attempt=attempt)
    children["ConfigMap"]["demo-progress"] = ConfigMapInfo("demo-progress", (("step", step),))
    return children


def _stalling_job(**status) -> dict:
    body = job_body(status={"attempt": 1, "phase": "Running", **status})
    body["spec"]["progressDeadlineSeconds"] = 60
    return body


def test_a_trainer_whose_step_does_not_advance_within_the_deadline_fails_its_attempt_as_stalled():
    children = _running_attempt("4")
    # The trainer started: the deadline counts from here.
    started = run(_stalling_job(), children)
    assert started.status.progress_time == NOW and started.status.phase == "Running"
    # Step 4 was reported 59 s ago: still within the deadline.
    recent = (NOW - timedelta(seconds=59)).isoformat()
    assert run(_stalling_job(step=4, progressTime=recent), children).status.phase == "Running"
    # 60 s without a new step: the attempt is stalled and retried, saying why.
    stale = (NOW - timedelta(seconds=60)).isoformat()
    plan = run(_stalling_job(step=4, progressTime=stale), children)
    stalled = state.condition(plan.status, state.ConditionType.STALLED)
    assert stalled is not None and stalled.status == "True" and stalled.reason == "NoProgress"
    assert "step 4 was the last" in stalled.message and "60s (spec.progressDeadlineSeconds)" in stalled.message
    assert plan.status.attempt == 2 and plan.status.phase == "Initializing" and plan.status.progress_time is None
    assert any(e.type == "Warning" and e.reason == "NoProgress" for e in plan.events)
    # The next pass replaces the stalled trainer Job like a failed one.
    again = run({**_stalling_job(), "status": status_of(plan)}, children)
    assert ("Delete", "Job", "demo-trainer") in kinds_and_names(again)


def test_a_new_step_is_progress_and_clears_the_stall():
    stale = (NOW - timedelta(seconds=600)).isoformat()
    stalled = {"type": "Stalled", "status": "True", "reason": "NoProgress", "lastTransitionTime": stale}
    plan = run(_stalling_job(step=4, progressTime=stale, attempt=2, conditions=[stalled]), _running_attempt("5", 2))
    assert plan.status.phase == "Running" and plan.status.attempt == 2
    assert plan.status.progress_time == NOW and plan.status.step == 5
    assert state.condition(plan.status, state.ConditionType.STALLED).status == "False"


def test_a_stall_on_the_last_allowed_attempt_fails_the_job():
    stale = (NOW - timedelta(seconds=60)).isoformat()
    body = _stalling_job(step=4, progressTime=stale, attempt=2)
    body["spec"]["backoffLimit"] = 1
    plan = run(body, _running_attempt("4", 2))
    assert plan.status.phase == "Failed" and plan.status.reason == "BackoffLimitExceeded"
    assert "made no progress for 60s" in plan.status.message


def test_without_a_progress_deadline_a_quiet_trainer_runs_on():
    stale = (NOW - timedelta(days=3)).isoformat()
    plan = run(
        job_body(status={"attempt": 1, "phase": "Running", "step": 4, "progressTime": stale}), _running_attempt("4")
    )
    assert plan.status.phase == "Running" and state.condition(plan.status, state.ConditionType.STALLED) is None


def test_a_suspended_job_counts_its_progress_deadline_afresh_when_it_resumes():
    stale = (NOW - timedelta(days=1)).isoformat()
    body = _stalling_job(step=4, progressTime=stale)
    body["spec"]["suspend"] = True
    suspended = run(body, _running_attempt("4"))
    assert suspended.status.phase == "Suspended" and suspended.status.progress_time is None
    resumed = run({**_stalling_job(), "status": status_of(suspended)}, _running_attempt("4"))
    assert resumed.status.phase == "Running" and resumed.status.progress_time == NOW
