"""What the operator wrote for one GRPOJob that its watch caches may not show yet: its expectations, as
KubeRay calls them.

A pass reads the job and its children from watch caches, which lag the operator's own writes by a few
milliseconds to seconds. A pass that runs in that gap (another child's event woke it) would otherwise
repeat a create (HTTP 409, a wasted write) or write the same status again with new timestamps. So each
write is remembered together with what the cache showed when it was made, and shown in place of the
cache for as long as the cache still shows that: once the cache moves on (our write arrived, or anything
newer did), the cache wins again. A backstop expiry bounds how long a write the cache never reflects
(an object without our labels, say) is believed.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from grpojob_operator.observe import Observed, Summary

EXPIRY_SECONDS = 30.0


@dataclass
class _Child:
    before: Summary | None
    """What the cache showed when the write was made (None: absent)."""
    after: Summary | None
    """What the write made of it (None: gone)."""
    expires: float


@dataclass
class Expectations:
    """One job's expectations: its writes not yet seen in the caches; used by that job's reconcile passes only."""

    status: dict[str, Any] | None = None
    """The status last written."""
    status_version: str = ""
    """The job's resourceVersion that write made."""
    own_versions: set[str] = field(default_factory=set)
    """Versions of the job that are ours and older than `status_version`: the one the first unseen write was
    computed from, and those each later write made. A cache that shows one of them has not caught up."""
    children: dict[tuple[str, str], _Child] = field(default_factory=dict)

    def job(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` with the status last written, while the cache shows one of our own older versions."""
        version = body.get("metadata", {}).get("resourceVersion", "")
        if self.status is not None and version in self.own_versions and version != self.status_version:
            return {**body, "status": self.status}
        self.status, self.status_version, self.own_versions = None, "", set()  # caught up, or moved on
        return body

    def wrote_status(self, base_version: str | None, status: dict[str, Any], new_version: str = "") -> None:
        if self.status is None:
            self.own_versions = {base_version or ""}
        self.own_versions.add(new_version)
        self.status, self.status_version = status, new_version

    def echoes_status(self, body: dict[str, Any]) -> bool:
        """Whether ``body`` is the job exactly as our last status write left it: the watch echoing that
        write, which tells a pass nothing it did not already plan from."""
        version = body.get("metadata", {}).get("resourceVersion")
        return self.status is not None and bool(version) and version == self.status_version

    def echoes_child(self, kind: str, summary: Summary) -> bool:
        """Whether ``summary`` is what our own unseen write made of that child (the watch echoing a create
        or an update): nothing new for a pass."""
        write = self.children.get((kind, summary.name))
        return write is not None and write.after == summary

    def observed(self, cached: Observed) -> Observed:
        """The cached children with this operator's unseen writes in place."""
        now = time.monotonic()
        children = {kind: dict(named) for kind, named in cached.children.items()}
        for (kind, name), write in list(self.children.items()):
            if cached.get(kind, name) != write.before or now > write.expires:
                del self.children[(kind, name)]  # the cache has moved on
            elif write.after is None:
                children.get(kind, {}).pop(name, None)
            else:
                children.setdefault(kind, {})[name] = write.after
        return Observed(children, cached.kueue)

    def wrote_child(self, kind: str, name: str, before: Summary | None, after: Summary | None) -> None:
        self.children[(kind, name)] = _Child(before, after, time.monotonic() + EXPIRY_SECONDS)

    def deleted_child(self, kind: str, name: str, before: Summary | None) -> None:
        """A delete: the child is shown as being deleted, or as gone if its summary cannot say so."""
        after = dataclasses.replace(before, deleting=True) if hasattr(before, "deleting") else None
        self.wrote_child(kind, name, before, after)
