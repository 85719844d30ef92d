"""Stage: the environments' Deployments and Services, started once the endpoints are published. A NeMo Gym
environment's config (`<job>-env-<name>-nemo-gym`) is written from the endpoints before its Deployment,
and a new head rolls its pods.

EnvironmentsReady says at once (reason EnvironmentFailing) which environment's server crashed, waits in a
state that does not resolve on its own, or runs without becoming ready for `NOT_READY_SECONDS`, with the end
of its log; failing the job for it is the deadlines stage's, after `pod_failure_grace_seconds`. The message
holds nothing that changes from pass to pass (no age, no restart count), so an unchanged failure is not
written again.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from grpojob_api import v1alpha1 as api
from grpojob_api.v1alpha1 import ConditionType
from grpojob_operator import names
from grpojob_operator.children.environments import build_environment_deployment, build_environment_service
from grpojob_operator.children.nemo_gym import build_nemo_gym_config_map, build_nemo_gym_deployment
from grpojob_operator.observe import DeploymentInfo, PodInfo, last_line
from grpojob_operator.plan.actions import Action, Create, Patch
from grpojob_operator.plan.conditions import set_condition
from grpojob_operator.plan.config_maps import config_map_actions
from grpojob_operator.plan.context import GO_ON, Pass


def environments(pass_: Pass) -> bool:
    """Create each environment's Deployment and Service; EnvironmentsReady says which are not ready yet and,
    for each whose pods are in trouble, what keeps them from being ready (`environment_problem`)."""
    job, plan, status, observed = pass_.job, pass_.plan, pass_.status, pass_.observed
    not_ready, failing = [], []
    for env in job.spec.environments:
        name = pass_.child.environment(env.name)
        if env.nemo_gym is not None:
            plan.actions += _nemo_gym_actions(pass_, env)
        elif not observed.has("Deployment", name):
            deployment = build_environment_deployment(job, env, pass_.settings, status.attempt)
            plan.actions.append(Create(pass_.place(deployment)))
        if not observed.has("Service", name):
            plan.actions.append(Create(build_environment_service(job, env)))
        current: DeploymentInfo | None = observed.get("Deployment", name)
        if current is None or current.ready_replicas < env.replicas:
            ready = current.ready_replicas if current else 0
            not_ready.append(f"{env.name} {ready}/{env.replicas}")
            pods = [p for p in observed.pods() if p.environment == env.name and p.component == "environment"]
            problem = environment_problem(pods, pass_.now)
            if problem:
                failing.append(f"{env.name}: {problem}")
    if failing:
        message = "; ".join(failing) + " (ready: " + ", ".join(not_ready) + ")"
        set_condition(status, ConditionType.ENVIRONMENTS_READY, False, "EnvironmentFailing", message, pass_.now)
    elif not_ready:
        message = "ready: " + ", ".join(not_ready)
        set_condition(status, ConditionType.ENVIRONMENTS_READY, False, "EnvironmentsStarting", message, pass_.now)
    else:
        message = f"{len(job.spec.environments)} ready"
        set_condition(status, ConditionType.ENVIRONMENTS_READY, True, "EnvironmentsReady", message, pass_.now)
    return GO_ON


def _nemo_gym_actions(pass_: Pass, env: api.EnvironmentSpec) -> list[Action]:
    """A NeMo Gym environment's config and Deployment, following the endpoints: when the config or the Ray
    head changed, the config is rewritten first, then the pod template's hash, which rolls the pods."""
    job, observed, head = pass_.job, pass_.observed, pass_.head
    actions = config_map_actions(build_nemo_gym_config_map(job, env, pass_.endpoints), observed)
    deployment = build_nemo_gym_deployment(job, env, pass_.settings, pass_.endpoints, head.name if head else "")
    current: DeploymentInfo | None = observed.get("Deployment", deployment["metadata"]["name"])
    wanted = deployment["spec"]["template"]["metadata"]["annotations"][names.NEMO_GYM_CONFIG_HASH_ANNOTATION]
    if current is None:
        actions.append(Create(pass_.place(deployment)))
    elif current.nemo_gym_config_hash != wanted:
        annotations = {names.NEMO_GYM_CONFIG_HASH_ANNOTATION: wanted}
        patch = {"spec": {"template": {"metadata": {"annotations": annotations}}}}
        actions.append(Patch("Deployment", current.name, patch))
    return actions


NOT_READY_SECONDS = 120.0
"""How long an environment's pod may run without becoming ready before EnvironmentsReady names it."""


def environment_problem(pods: Iterable[PodInfo], now: datetime) -> str:
    """Why the first of an environment's ``pods`` that is in trouble is not ready, in one line; "" when none
    is: a container that crashed (how, and the last lines of its log), one waiting in a reason that never
    resolves on its own, or a pod Running and not ready for over `NOT_READY_SECONDS`."""
    for pod in sorted(pods, key=lambda p: p.name):
        if pod.deleting or pod.ready:
            continue
        crashes = {container: (how, tail) for container, how, tail in pod.crashed}
        for container, reason, message in pod.stuck:
            if container not in crashes:  # a crash says more than the back-off it waits in
                return f"pod {pod.name} container {container} is in {reason}: {last_line(message)}"
        for container, (how, tail) in crashes.items():
            return f"pod {pod.name} container {container} stopped ({how}): {tail or 'no log'}"
        since = pod.ready_since or pod.created
        if pod.phase == "Running" and since is not None and (now - since).total_seconds() > NOT_READY_SECONDS:
            return (
                f"pod {pod.name} is Running and not ready for over {NOT_READY_SECONDS:.0f} s "
                f"(since {since.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}): its readiness probe fails"
            )
    return ""
