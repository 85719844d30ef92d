"""One pass of the plan as its stages see it: the job, what is observed of it, the plan being made, and what
earlier stages found for later ones (where Kueue placed the job, the Ray head, the endpoints)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from grpojob_api import v1alpha1 as api
from grpojob_operator import kueue, names
from grpojob_operator.observe import Observed, PodInfo
from grpojob_operator.plan.actions import Plan
from grpojob_operator.settings import OperatorSettings

ConfigMapBuilder = Callable[[api.GRPOJob], dict[str, Any]]
"""Builds the job's `<job>-config` ConfigMap (`children.trainer.build_config_map`, or a memo of it)."""


@dataclass
class Pass:
    """The inputs of one pass over a valid job, the plan its stages add to, and what they found."""

    job: api.GRPOJob
    plan: Plan
    observed: Observed
    settings: OperatorSettings
    now: datetime
    config_map: ConfigMapBuilder
    place: kueue.Placer = field(default_factory=lambda: kueue.placer(None))
    """Puts a child's pods where Kueue admitted them (the identity for a job Kueue does not manage)."""
    head: PodInfo | None = None
    """The ready Ray head pod, once the Ray cluster stage found it."""
    endpoints: dict[str, str] = field(default_factory=dict)
    """The data of `<job>-endpoints`, once the endpoints stage wrote it."""

    @property
    def status(self) -> api.GRPOJobStatus:
        return self.plan.status

    @property
    def child(self) -> names.ChildNames:
        return names.ChildNames(self.job.metadata.name)


Stage = Callable[[Pass], bool]
"""A step of the plan: adds to ``pass_.plan``; returns GO_ON for the next stage to run, or STOP to end the pass."""
GO_ON = True
STOP = False
