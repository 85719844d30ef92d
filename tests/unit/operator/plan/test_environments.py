"""The environments stage on its own: each environment's Deployment and Service, and EnvironmentsReady;
and through whole passes, an environment whose server crashes or never becomes ready, named in
EnvironmentsReady at once. (NeMo Gym environments: tests/unit/operator/plan/test_nemo_gym.py.)"""

from __future__ import annotations

from datetime import timedelta

from grpojob_api import v1alpha1 as api
from grpojob_operator.observe import DeploymentInfo, OtherInfo, last_lines
from grpojob_operator.plan.actions import Plan
from grpojob_operator.plan.conditions import condition
from grpojob_operator.plan.context import GO_ON
from grpojob_operator.plan.environments import NOT_READY_SECONDS, environments

from ..conftest import job_body
from .conftest import NOW, base_children, kinds_and_names, one_pass, pod, run, status_of, with_endpoints


def test_missing_environments_are_created_and_reported_not_ready():
    pass_ = one_pass(job_body(), {})
    assert environments(pass_) is GO_ON
    assert kinds_and_names(pass_.plan) == [
        ("Create", "Deployment", "demo-env-math"),
        ("Create", "Service", "demo-env-math"),
    ]
    ready = condition(pass_.status, api.ConditionType.ENVIRONMENTS_READY)
    assert ready is not None and (ready.status, ready.message) == ("False", "ready: math 0/1")


def test_ready_environments_are_reported_ready():
    children = {
        "Deployment": {"demo-env-math": DeploymentInfo("demo-env-math", 1)},
        "Service": {"demo-env-math": OtherInfo("demo-env-math", False)},
    }
    pass_ = one_pass(job_body(), children)
    assert environments(pass_) is GO_ON and pass_.plan.actions == []
    ready = condition(pass_.status, api.ConditionType.ENVIRONMENTS_READY)
    assert ready is not None and (ready.status, ready.reason) == ("True", "EnvironmentsReady")


# What a NeMo Gym server that dies at start leaves in its pod's status: the end of its log
# (FallbackToLogsOnError), the same on every restart.
CRASH_LOG = "\n".join(
    [
        "starting ray",
        "Ray runtime started.",
        "Traceback (most recent call last):",
        '  File "/opt/nemo-gym/bin/gym", line 8, in <module>',
        "    sys.exit(main())",
        "ModuleNotFoundError: No module named 'sympy'",
        "",
    ]
)
CRASHED = (("nemo-gym", "exit code 1, Error", last_lines(CRASH_LOG)),)
BACK_OFF = (("nemo-gym", "CrashLoopBackOff", "back-off 40s restarting failed container=nemo-gym"),)


def with_math_pod(**fields) -> dict:
    """The children of a job whose environment `math` has no ready replica and one pod with ``fields``."""
    children = with_endpoints(base_children())
    children["Deployment"]["demo-env-math"] = DeploymentInfo("demo-env-math", 0)
    fields = {"ready": False, "environment": "math", "ready_since": NOW} | fields
    children["Pod"]["demo-env-math-7f9c"] = pod("demo-env-math-7f9c", "environment", attempt=1, **fields)
    return children


def environments_ready(plan: Plan) -> tuple[str, str, str]:
    ready = condition(plan.status, api.ConditionType.ENVIRONMENTS_READY)
    assert ready is not None
    return ready.status, ready.reason, ready.message


def test_a_crash_looping_server_is_named_at_once_with_the_last_lines_of_its_log():
    plan = run(job_body(status={"attempt": 1}), with_math_pod(stuck=BACK_OFF, crashed=CRASHED))
    assert environments_ready(plan) == (
        "False",
        "EnvironmentFailing",
        "math: pod demo-env-math-7f9c container nemo-gym stopped (exit code 1, Error): Ray runtime started. | "
        'Traceback (most recent call last): | File "/opt/nemo-gym/bin/gym", line 8, in <module> | sys.exit(main()) | '
        "ModuleNotFoundError: No module named 'sympy' (ready: math 0/1)",
    )
    assert plan.status.phase == "Initializing"  # the job fails only after pod_failure_grace_seconds


def test_a_crash_loop_writes_the_condition_once_whether_the_server_waits_to_restart_or_runs_again():
    waiting = run(job_body(status={"attempt": 1}), with_math_pod(stuck=BACK_OFF, crashed=CRASHED))
    written = status_of(waiting)
    restarted = with_math_pod(crashed=CRASHED, ready_since=NOW + timedelta(seconds=40))
    again = run(job_body(status=written), restarted, now=NOW + timedelta(seconds=50))
    assert again.status == waiting.status and status_of(again) == written


def test_a_server_waiting_in_a_state_that_never_resolves_is_named_with_the_reason():
    stuck = (("nemo-gym", "ImagePullBackOff", 'Back-off pulling image "ghcr.io/me/my-gym:1"'),)
    plan = run(job_body(status={"attempt": 1}), with_math_pod(phase="Pending", stuck=stuck))
    assert environments_ready(plan)[1:] == (
        "EnvironmentFailing",
        "math: pod demo-env-math-7f9c container nemo-gym is in ImagePullBackOff: Back-off pulling image "
        '"ghcr.io/me/my-gym:1" (ready: math 0/1)',
    )


def test_a_server_running_but_not_ready_is_named_after_two_minutes_and_not_before():
    children = with_math_pod(ready_since=NOW - timedelta(seconds=NOT_READY_SECONDS))
    assert environments_ready(run(job_body(), children))[1:] == ("EnvironmentsStarting", "ready: math 0/1")
    later = run(job_body(), children, now=NOW + timedelta(seconds=1))
    assert environments_ready(later)[1:] == (
        "EnvironmentFailing",
        "math: pod demo-env-math-7f9c is Running and not ready for over 120 s (since 2026-11-30T09:58:10Z): "
        "its readiness probe fails (ready: math 0/1)",
    )
    written = job_body(status=status_of(later))
    assert status_of(run(written, children, now=NOW + timedelta(seconds=90))) == status_of(later)


def test_pods_of_other_environments_ready_ones_and_those_going_away_are_not_blamed():
    children = with_math_pod(ready=True, crashed=CRASHED)
    children["Pod"]["demo-env-tools-1"] = pod("demo-env-tools-1", "environment", environment="tools", crashed=CRASHED)
    children["Pod"]["demo-env-math-old"] = pod(
        "demo-env-math-old", "environment", environment="math", ready=False, deleting=True, crashed=CRASHED
    )
    assert environments_ready(run(job_body(), children))[1:] == ("EnvironmentsStarting", "ready: math 0/1")


def test_a_failing_environment_fails_the_job_only_after_the_grace_period():
    late = with_math_pod(stuck=BACK_OFF, crashed=CRASHED, ready_since=NOW - timedelta(seconds=61))
    plan = run(job_body(status={"attempt": 1}), late)
    assert plan.status.phase == "Failed" and plan.status.reason == "CrashLoopBackOff"


def test_a_reward_file_that_does_not_import_is_named_in_environments_ready():
    """The reward server stops before it serves, the import error the last line of its log (as
    tests/trainer/test_reward_functions.py shows the server write it), which is its termination message."""
    log = (
        "environment rewards: reward file /etc/grpojob-rewards/gsm8k.py does not import: "
        "ModuleNotFoundError: No module named 'numpy' (gsm8k.py, line 1)\n"
    )
    crashed = (("environment", "exit code 1, Error", last_lines(log)),)

    plan = run(job_body(status={"attempt": 1}), with_math_pod(crashed=crashed))

    status, reason, message = environments_ready(plan)
    assert (status, reason) == ("False", "EnvironmentFailing")
    assert message == (
        "math: pod demo-env-math-7f9c container environment stopped (exit code 1, Error): environment rewards: "
        "reward file /etc/grpojob-rewards/gsm8k.py does not import: ModuleNotFoundError: No module named 'numpy' "
        "(gsm8k.py, line 1) (ready: math 0/1)"
    )
