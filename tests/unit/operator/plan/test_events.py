"""Which status changes post an Event: a run that ends, breaks or is paused; never the way to Running."""

from __future__ import annotations

from grpojob_api import v1alpha1 as api
from grpojob_operator.observe import TrainerJobInfo
from grpojob_operator.plan.events import transition_events

from ..conftest import job_body
from .conftest import base_children, pod, run, with_endpoints


def test_a_trainer_that_fails_while_the_job_is_initializing_posts_a_warning():
    # The attempt's Job failed before its pod ever ran: the job stays Initializing for the retry.
    children = with_endpoints(base_children())
    children["Job"] = {"demo-trainer": TrainerJobInfo("demo-trainer", 1, False, True, "BackoffLimitExceeded", False)}
    children["Pod"]["demo-trainer-a"] = pod(
        "demo-trainer-a", "trainer", attempt=1, phase="Failed", terminated=(("trainer", 2, "Error"),)
    )
    plan = run(job_body(status={"attempt": 1, "phase": "Initializing"}), children)
    assert plan.status.phase == "Initializing" and plan.status.attempt == 2
    (event,) = plan.events
    assert (event.type, event.reason) == ("Warning", "TrainerFailed")
    assert "exited with code 2" in event.message


def test_an_unchanged_status_posts_nothing():
    status = api.GRPOJobStatus(phase=api.Phase.INITIALIZING, attempt=2)
    assert transition_events(status, status.model_copy(deep=True)) == []
