"""The admission stage on its own: a job without a queue goes on as it is; a labelled one waits for Kueue.
(The Workload's pod sets, placement and eviction, through whole passes: tests/unit/operator/test_kueue.py.)"""

from __future__ import annotations

from grpojob_api.v1alpha1 import Phase
from grpojob_operator import names
from grpojob_operator.plan.actions import Create
from grpojob_operator.plan.admission import admission
from grpojob_operator.plan.context import GO_ON, STOP

from ..conftest import job_body
from .conftest import one_pass


def test_a_job_without_a_queue_name_goes_on_unplaced():
    pass_ = one_pass(job_body(), {})
    assert admission(pass_) is GO_ON
    assert pass_.plan.actions == []
    manifest = {"kind": "Job", "metadata": {"labels": {}}, "spec": {"template": {}}}
    assert pass_.place(manifest) is manifest


def test_a_labelled_job_without_its_workload_creates_it_and_stops_queued():
    body = job_body()
    body["metadata"]["labels"] = {names.QUEUE_NAME_LABEL: "team"}
    pass_ = one_pass(body, {})
    assert admission(pass_) is STOP
    assert [a.manifest["kind"] for a in pass_.plan.actions if isinstance(a, Create)] == ["Workload"]
    assert pass_.status.phase == Phase.QUEUED and pass_.status.reason == "WaitingForAdmission"
