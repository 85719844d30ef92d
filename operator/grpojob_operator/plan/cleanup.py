"""Which of a job's children to delete when they must go (a finished, suspended or evicted job)."""

from __future__ import annotations

from typing import Any

from grpojob_api import v1alpha1 as api
from grpojob_operator import names
from grpojob_operator.observe import Observed
from grpojob_operator.plan.actions import Action, Delete


def deleting(summary: Any) -> bool:
    """Whether an observed child is on its way out already."""
    return bool(getattr(summary, "deleting", False))


def present(deletions: list[Delete], observed: Observed) -> list[Action]:
    """The deletions of children that exist and are not being deleted already."""
    return [d for d in deletions if observed.has(d.kind, d.name) and not deleting(observed.get(d.kind, d.name))]


def tensorboard_deletions(child: names.ChildNames) -> list[Delete]:
    return [Delete("Deployment", child.tensorboard), Delete("Service", child.tensorboard)]


def child_deletions(job: api.GRPOJob, observed: Observed, *, trainer: bool) -> list[Action]:
    """Delete the Ray cluster, the endpoints and the environments (and with ``trainer``, the trainer Job and
    TensorBoard): what holds resources and addresses; the config, the RBAC and the claims stay."""
    child = names.ChildNames(job.metadata.name)
    candidates: list[Delete] = [
        Delete("RayCluster", child.raycluster),
        Delete("ConfigMap", child.endpoints),
    ]
    for env in job.spec.environments:
        candidates.append(Delete("Deployment", child.environment(env.name)))
        candidates.append(Delete("Service", child.environment(env.name)))
        if env.nemo_gym is not None:
            candidates.append(Delete("ConfigMap", child.nemo_gym_config(env.name)))
    if trainer:
        candidates.append(Delete("Job", child.trainer, "Foreground"))
        candidates += tensorboard_deletions(child)
    return present(candidates, observed)
