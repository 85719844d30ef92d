"""The environments stage on its own: each environment's Deployment and Service, and EnvironmentsReady.
(NeMo Gym environments, through whole passes: tests/unit/operator/test_nemo_gym.py.)"""

from __future__ import annotations

from grpojob_api import v1alpha1 as api
from grpojob_operator.observe import DeploymentInfo, OtherInfo
from grpojob_operator.plan.conditions import condition
from grpojob_operator.plan.context import GO_ON
from grpojob_operator.plan.environments import environments

from ..conftest import job_body
from .conftest import kinds_and_names, one_pass


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
