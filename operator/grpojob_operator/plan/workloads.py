"""What the plan writes into a job's Kueue Workload status needs Kueue's time format."""

from __future__ import annotations

from datetime import UTC, datetime


def kueue_time(now: datetime) -> str:
    """A time as Kueue writes it in a Workload's conditions."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
