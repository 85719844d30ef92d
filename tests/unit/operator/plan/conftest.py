"""Shared inputs of the plan's tests: job `demo` (tests/unit/operator/conftest.py), its pods and children
as the watches would show them, and one pass of the plan over them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from grpojob_api import v1alpha1 as api
from grpojob_api.admission import parse_job
from grpojob_operator.children.endpoints import endpoints_data
from grpojob_operator.children.trainer import build_config_map
from grpojob_operator.observe import ConfigMapInfo, DeploymentInfo, Observed, OtherInfo, PodInfo, TrainerJobInfo
from grpojob_operator.plan import plan
from grpojob_operator.plan.actions import Create, Delete, Plan, Replace
from grpojob_operator.plan.context import Pass
from grpojob_operator.settings import OperatorSettings

from ..conftest import children_up_to_the_head, job_body

NOW = datetime(2026, 11, 30, 10, 0, 10, tzinfo=UTC)
SETTINGS = OperatorSettings(pod_failure_grace_seconds=60)
JOB = parse_job(job_body())


def pod(name: str, component: str, *, ip: str | None = "10.0.0.2", attempt: int | None = None, **kw) -> PodInfo:
    base = dict(
        phase="Running", ready=True, ip=ip, deleting=False, created=NOW - timedelta(seconds=5), ready_since=None
    )
    base.update(kw)
    return PodInfo(name=name, component=component, attempt=attempt, **base)


def base_children(head_ready: bool = True, head_ip: str = "10.0.0.2") -> dict:
    return children_up_to_the_head(JOB, pod("demo-head", "ray-head", ip=head_ip), head_ready)


def with_endpoints(children: dict, ip: str = "10.0.0.2", attempt: int = 1) -> dict:
    data = endpoints_data(JOB, SETTINGS, ip, attempt)
    children["ConfigMap"]["demo-endpoints"] = ConfigMapInfo("demo-endpoints", tuple(sorted(data.items())))
    children["Deployment"] = {"demo-env-math": DeploymentInfo("demo-env-math", 1)}
    children["Service"]["demo-env-math"] = OtherInfo("demo-env-math", False)
    return children


def with_report(children: dict, **report: str) -> dict:
    """``children`` with the trainer's ``report`` in `demo-config`, beside the config."""
    config = children["ConfigMap"]["demo-config"]
    children["ConfigMap"]["demo-config"] = ConfigMapInfo(
        config.name, tuple(sorted({**config.as_dict(), **report}.items()))
    )
    return children


def kinds_and_names(plan: Plan) -> list[tuple[str, str, str]]:
    out = []
    for action in plan.actions:
        if isinstance(action, (Create, Replace)):
            out.append((type(action).__name__, action.manifest["kind"], action.manifest["metadata"]["name"]))
        elif isinstance(action, Delete):
            out.append(("Delete", action.kind, action.name))
    return out


def run(body: dict, children: dict, now: datetime = NOW) -> Plan:
    """One whole pass of the plan."""
    return plan(body, Observed(children), SETTINGS, now)


def one_pass(body: dict, children: dict) -> Pass:
    """The inputs of a pass over ``body`` (valid) for one stage on its own."""
    status = api.GRPOJobStatus.model_validate(body.get("status") or {})
    job = parse_job({k: v for k, v in body.items() if k != "status"})
    return Pass(job, Plan(status=status), Observed(children), SETTINGS, NOW, build_config_map)


def running_attempt(step: str, attempt: int = 1) -> dict:
    """The children of attempt ``attempt`` running, its trainer having reported step ``step``."""
    children = with_endpoints(base_children(), attempt=attempt)
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", attempt, False, False, "", False)}
    children["Pod"]["demo-trainer-x"] = pod("demo-trainer-x", "trainer", attempt=attempt)
    return with_report(children, step=step)


def stalling_job(**status) -> dict:
    """A running job with spec.progressDeadlineSeconds 60 and ``status``."""
    body = job_body(status={"attempt": 1, "phase": "Running", **status})
    body["spec"]["progressDeadlineSeconds"] = 60
    return body


def status_of(plan: Plan) -> dict:
    return plan.status.model_dump(mode="json", by_alias=True)
