"""What a reconcile pass sees of a job's children, and how it sends its writes."""

from __future__ import annotations

from grpojob_operator import kinds, state
from grpojob_operator.handlers import (
    index_id,
    observed_from_indexes,
    waits_on_the_clock,
    write_groups,
)
from grpojob_operator.observe import Observed, OtherInfo
from grpojob_operator.unseen import Unseen


def test_children_of_an_earlier_job_with_the_same_name_are_ignored():
    indexes = {index_id(k.kind): {} for k in kinds.WATCHED}
    indexes[index_id("Service")] = {
        ("ns", "demo", "uid-old"): [OtherInfo("demo-generation", True)],
        ("ns", "demo", "uid-new"): [OtherInfo("demo-env-math", False)],
    }
    observed = observed_from_indexes(indexes, "ns", "demo", "uid-new")
    assert observed.has("Service", "demo-env-math")
    assert not observed.has("Service", "demo-generation")


def test_independent_writes_are_grouped_and_a_config_map_or_claim_is_written_before_what_follows_it():
    def create(kind: str, name: str) -> state.Create:
        return state.Create({"kind": kind, "metadata": {"name": name}})

    first_pass = [
        create("RayCluster", "demo"),
        create("ConfigMap", "demo-config"),
        create("Service", "demo-generation"),
        create("ConfigMap", "demo-progress"),
        create("ServiceAccount", "demo-trainer"),
        create("Role", "demo-trainer"),
    ]
    assert write_groups(first_pass) == [first_pass[:2], first_pass[2:4], first_pass[4:]]
    head_ready = [create("ConfigMap", "demo-endpoints"), create("Deployment", "demo-env-a"), create("Job", "demo-t")]
    assert write_groups(head_ready) == [head_ready[:1], head_ready[1:]]
    delete = state.Delete("batch/v1", "Job", "demo-trainer", "Foreground")
    retry = [state.Replace({"kind": "ConfigMap", "metadata": {"name": "demo-endpoints"}, "data": {}}), delete]
    assert write_groups(retry) == [retry[:1], [delete]]
    hub_model = [create("NetworkPolicy", "demo"), create("PersistentVolumeClaim", "demo-model-cache")]
    hub_model.append(create("Job", "demo-model"))
    assert write_groups(hub_model) == [hub_model[:2], hub_model[2:]]


def test_only_a_job_with_something_due_is_reconciled_again_when_nothing_changed():
    running = {"spec": {}, "status": {"phase": "Running"}}
    assert not waits_on_the_clock(running, Observed({}), Unseen())
    assert waits_on_the_clock({"spec": {"activeDeadlineSeconds": 60}, "status": {}}, Observed({}), Unseen())
    assert waits_on_the_clock({"spec": {"progressDeadlineSeconds": 60}, "status": {}}, Observed({}), Unseen())
    finished = {"spec": {"ttlSecondsAfterFinished": 5, "activeDeadlineSeconds": 60}, "status": {"phase": "Failed"}}
    assert waits_on_the_clock(finished, Observed({}), Unseen())
    assert not waits_on_the_clock(
        {"spec": {"activeDeadlineSeconds": 60}, "status": {"phase": "Succeeded"}}, Observed({}), Unseen()
    )
    unseen = Unseen()
    unseen.wrote_child("Service", "demo-env-a", None, OtherInfo("demo-env-a", False))
    assert waits_on_the_clock(running, Observed({}), unseen), "an unseen write expires"
