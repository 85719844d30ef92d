"""The Ray cluster stages: the RayCluster and the children that need no address, then the wait for a ready head."""

from __future__ import annotations

import dataclasses

from grpojob_api import v1alpha1 as api
from grpojob_operator.observe import ConfigMapInfo, RayClusterInfo
from grpojob_operator.plan.actions import Replace
from grpojob_operator.plan.conditions import condition
from grpojob_operator.plan.context import GO_ON, STOP
from grpojob_operator.plan.ray_cluster import ray_head

from ..conftest import job_body
from .conftest import NOW, base_children, kinds_and_names, one_pass, pod, run, with_endpoints, with_report


def test_a_new_job_gets_its_raycluster_and_config_but_no_endpoints_before_the_head_is_ready():
    plan = run(job_body(), {})
    assert kinds_and_names(plan) == [
        ("Create", "NetworkPolicy", "demo-network"),  # before any pod of the job exists
        ("Create", "RayCluster", "demo"),
        ("Create", "ConfigMap", "demo-config"),
        ("Create", "Service", "demo-generation"),
        ("Create", "ServiceAccount", "demo-trainer"),
        ("Create", "Role", "demo-trainer"),
        ("Create", "RoleBinding", "demo-trainer"),
    ]
    assert plan.status.phase == "Initializing"
    assert plan.status.start_time == NOW
    ready = condition(plan.status, api.ConditionType.RAY_CLUSTER_READY)
    assert ready is not None and ready.status == "False"


def test_a_ready_head_pod_without_an_ip_is_not_published():
    children = base_children()
    children["Pod"] = {"demo-head": pod("demo-head", "ray-head", ip=None)}  # type: ignore[arg-type]
    assert not any(a for a in kinds_and_names(run(job_body(), children)) if a[2] == "demo-endpoints")


def test_a_raycluster_being_deleted_is_not_a_ready_head():
    children = base_children()
    children["RayCluster"]["demo"] = RayClusterInfo("demo", deleting=True)
    plan = run(job_body(), children)
    assert not any(name == "demo-endpoints" for _, _, name in kinds_and_names(plan))
    assert plan.status.phase == "Initializing"


def test_a_head_pod_that_is_not_ready_is_not_published():
    children = base_children()
    children["Pod"] = {"demo-head": pod("demo-head", "ray-head", ready=False)}
    assert not any(name == "demo-endpoints" for _, _, name in kinds_and_names(run(job_body(), children)))


def test_the_config_follows_a_spec_changed_while_suspended_and_keeps_the_trainers_report():
    children = base_children(head_ready=False)
    kept = (("grpojob.yaml", "old"), ("extra", "x"), ("step", "7"), ("meanReward", "0.5"))
    children["ConfigMap"]["demo-config"] = ConfigMapInfo("demo-config", kept)
    plan = run(job_body(), children)
    (replace,) = [a for a in plan.actions if isinstance(a, Replace)]
    assert replace.manifest["metadata"]["name"] == "demo-config"
    assert replace.stale_keys == ("extra",), "the step and reward are the trainer's, not stale"


def test_the_trainers_report_beside_an_unchanged_config_changes_nothing():
    plan = run(job_body(), with_report(base_children(head_ready=False), step="7", meanReward="0.5"))
    assert not [a for a in plan.actions if isinstance(a, Replace)]


def test_a_pod_the_scheduler_cannot_place_is_explained_without_failing_the_job():
    children = base_children(head_ready=False)
    children["Pod"] = {
        "demo-head": pod("demo-head", "ray-head", ip=None, phase="Pending", ready=False, unschedulable="0/6 nodes")
    }
    plan = run(job_body(), children)
    ready = condition(plan.status, api.ConditionType.RAY_CLUSTER_READY)
    assert plan.status.phase == "Initializing"
    assert ready is not None and ready.message.endswith("pod demo-head cannot be scheduled: 0/6 nodes")


def test_a_worker_the_scheduler_cannot_place_holds_the_gate_behind_a_ready_head_until_the_endpoints_exist():
    children = base_children()
    children["Pod"]["demo-worker-0"] = pod(
        "demo-worker-0",
        "generation",
        ip=None,
        phase="Pending",
        ready=False,
        scheduled=False,
        unschedulable="0/6 nodes: nvidia.com/gpu",
    )
    waiting = one_pass(job_body(), children)
    assert ray_head(waiting) is STOP
    ready = condition(waiting.status, api.ConditionType.RAY_CLUSTER_READY)
    assert ready is not None and ready.message == (
        "waiting for the Ray head pod and its workers; pod demo-worker-0 cannot be scheduled: 0/6 nodes: nvidia.com/gpu"
    )
    # Before the scheduler has tried it, a worker not on a node holds the gate too (no race with its verdict).
    children["Pod"]["demo-worker-0"] = dataclasses.replace(children["Pod"]["demo-worker-0"], unschedulable="")
    assert ray_head(one_pass(job_body(), children)) is STOP
    # Once published (a worker evicted later, say), the running job is not held back.
    assert ray_head(one_pass(job_body(), with_endpoints(children))) is GO_ON


def test_the_head_stage_hands_the_ready_head_to_the_stages_after_it():
    pass_ = one_pass(job_body(), base_children())
    assert ray_head(pass_) is GO_ON and pass_.head is not None and pass_.head.name == "demo-head"
    waiting = one_pass(job_body(), base_children(head_ready=False))
    assert ray_head(waiting) is STOP and waiting.head is None
