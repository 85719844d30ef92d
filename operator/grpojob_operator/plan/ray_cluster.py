"""Stages: the Ray cluster and the children that need no address (`<job>-config`, `<job>-generation`, the
trainer's RBAC), then the wait for its head: a head pod that is Ready (KubeRay's
probe of the raylet and the GCS) with an IP, and, until the endpoints are first written, every Ray pod on a
node."""

from __future__ import annotations

from grpojob_api import endpoints, placement
from grpojob_api.progress import REPORT_KEYS
from grpojob_api.v1alpha1 import ConditionType, Phase
from grpojob_operator import names
from grpojob_operator.children.raycluster import build_generation_service, build_raycluster
from grpojob_operator.children.trainer import build_trainer_rbac
from grpojob_operator.observe import RayClusterInfo
from grpojob_operator.plan.actions import Create
from grpojob_operator.plan.conditions import condition, set_condition
from grpojob_operator.plan.config_maps import config_map_actions
from grpojob_operator.plan.context import GO_ON, STOP, Pass

RAY_COMPONENTS = (names.HEAD_COMPONENT, endpoints.GENERATION_GROUP, endpoints.POLICY_GROUP, endpoints.COLOCATED_GROUP)
"""The `grpo.dev/component` of the RayCluster's pods."""


def ray_cluster(pass_: Pass) -> bool:
    """Create the RayCluster and the children that need no address; the config follows the spec (which may
    have changed while the job was suspended)."""
    job, plan, observed = pass_.job, pass_.plan, pass_.observed
    pass_.status.placement = job.spec.resolved_placement
    if not observed.has("RayCluster", pass_.child.raycluster):
        plan.actions.append(Create(pass_.place(build_raycluster(job, pass_.settings))))
    plan.actions += config_map_actions(pass_.config_map(job), observed, kept=REPORT_KEYS)
    rest = [build_generation_service(job), *build_trainer_rbac(job)]
    plan.actions += [Create(m) for m in rest if not observed.has(m["kind"], m["metadata"]["name"])]
    return GO_ON


def ray_head(pass_: Pass) -> bool:
    """Go on (with ``pass_.head`` set) once the head is ready and, until the endpoints are published, every pod of
    the Ray cluster is on a node; a RayCluster being deleted (after a suspend) does not count."""
    job, status, observed, now = pass_.job, pass_.status, pass_.observed, pass_.now
    cluster: RayClusterInfo | None = observed.get("RayCluster", pass_.child.raycluster)
    head = observed.head_pod()
    live = [p for p in observed.pods() if not p.deleting]
    unplaced = [p for p in live if p.unschedulable]
    # Before the endpoints are published, a Ray pod not on a node (or not created yet: KubeRay creates the
    # workers once the head runs) holds the gate even behind a ready head, so that a job bigger than the fleet
    # says why instead of starting a trainer that cannot place its workers (RayJob waits for every pod too).
    ray_pods = [p for p in live if p.component in RAY_COMPONENTS]
    expected = 1 + sum(group.replicas for group in placement.layout(job.spec).groups)
    placed = len(ray_pods) >= expected and all(p.scheduled for p in ray_pods)
    gate_open = observed.has("ConfigMap", pass_.child.endpoints)
    if cluster is None or cluster.deleting or head is None or not (placed or gate_open):
        # One reason from the RayCluster's creation to its ready head, so that its progress through KubeRay's
        # states costs no status write; only what the user must see (a pod that cannot be placed) does.
        message = "waiting for the Ray head pod and its workers"
        if unplaced:
            # Not a failure (capacity may come: an autoscaler, a queue), but the user should see why.
            message += f"; pod {unplaced[0].name} cannot be scheduled: {unplaced[0].unschedulable}"
        set_condition(status, ConditionType.RAY_CLUSTER_READY, False, "WaitingForRayHead", message, now)
        trainer_running = condition(status, ConditionType.TRAINER_RUNNING)
        if not (trainer_running and trainer_running.status == "True"):
            status.phase = Phase.INITIALIZING
        return STOP
    # The workers' count is not in the message: each worker's start would be a status write.
    set_condition(status, ConditionType.RAY_CLUSTER_READY, True, "HeadPodReady", f"head pod {head.name}", now)
    pass_.head = head
    return GO_ON
