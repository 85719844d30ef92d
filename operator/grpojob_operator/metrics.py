"""Prometheus metrics of the operator: jobs by phase, reconcile duration, time to a ready Ray head."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from grpojob_api import v1alpha1 as api
from grpojob_api.v1alpha1 import ConditionType, Phase

JOBS = Gauge("grpojob_jobs", "GRPOJobs known to the operator, by phase", ["phase"])
RECONCILE_SECONDS = Histogram(
    "grpojob_reconcile_duration_seconds",
    "Time of one reconcile pass of one GRPOJob",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
HEAD_READY_SECONDS = Histogram(
    "grpojob_time_to_head_ready_seconds",
    "Time from a GRPOJob's creation to its Ray head being ready and its endpoints published",
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
)

API_WRITES = Counter(
    "grpojob_api_writes_total",
    "API requests of the operator that write, by verb and kind (`GRPOJob/status`, `Event`, a child's kind); "
    "Kopf itself writes nothing",
    ["verb", "kind"],
)

_phases: dict[tuple[str, str], Phase] = {}
_head_ready_seen: set[tuple[str, str]] = set()


def serve(port: int) -> None:
    """Expose /metrics on ``port`` (0: do not)."""
    if port:
        start_http_server(port)


def observe_pass(body: dict[str, Any], status: api.GRPOJobStatus, seconds: float) -> None:
    """Record one reconcile pass of a job."""
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    RECONCILE_SECONDS.observe(seconds)
    _phases[key] = status.phase
    published = next((c for c in status.conditions if c.type == ConditionType.ENDPOINTS_PUBLISHED.value), None)
    created = meta.get("creationTimestamp")
    if published is not None and published.status == "True" and key not in _head_ready_seen and created:
        _head_ready_seen.add(key)
        start = datetime.fromisoformat(created.replace("Z", "+00:00"))
        HEAD_READY_SECONDS.observe(max(0.0, (published.last_transition_time - start).total_seconds()))
    _refresh()


def forget(namespace: str, name: str) -> None:
    _phases.pop((namespace, name), None)
    _head_ready_seen.discard((namespace, name))
    _refresh()


def known_jobs() -> int:
    return len(_phases)


def _refresh() -> None:
    for phase in Phase:
        JOBS.labels(phase=phase.value).set(sum(1 for p in _phases.values() if p == phase))
