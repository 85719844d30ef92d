"""What a reconcile pass decides: the writes to make (actions), in order, the status to write, the Events to post."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from grpojob_api import v1alpha1 as api


@dataclass(frozen=True)
class Create:
    manifest: dict[str, Any]


@dataclass(frozen=True)
class Replace:
    """Make a ConfigMap's data the manifest's (``stale_keys``: keys it has that the manifest has not)."""

    manifest: dict[str, Any]
    stale_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Patch:
    """Merge-patch a child (``patch`` holds only the fields to change)."""

    kind: str
    name: str
    patch: dict[str, Any]
    subresource: str = ""


@dataclass(frozen=True)
class Delete:
    """Delete a child (``Foreground``: its dependents, a Job's pods, go first)."""

    kind: str
    name: str
    propagation: Literal["Background", "Foreground"] = "Background"


@dataclass(frozen=True)
class DeleteJob:
    """Delete the GRPOJob itself (ttlSecondsAfterFinished)."""


Action = Create | Replace | Patch | Delete | DeleteJob


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class Plan:
    """What one reconcile pass does: actions in order, then one status write, then events."""

    status: api.GRPOJobStatus
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
