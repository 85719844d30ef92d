"""Stage: the NetworkPolicy goes first: the job's pods are never reachable from outside the job."""

from __future__ import annotations

from grpojob_operator.children.network import build_network_policy
from grpojob_operator.plan.actions import Create
from grpojob_operator.plan.context import GO_ON, Pass


def network_policy(pass_: Pass) -> bool:
    """Create the job's NetworkPolicy before any of its pods."""
    if not pass_.observed.has("NetworkPolicy", pass_.child.network_policy):
        pass_.plan.actions.append(Create(build_network_policy(pass_.job)))
    return GO_ON
