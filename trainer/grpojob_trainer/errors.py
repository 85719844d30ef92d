"""Errors the `grpojob` command reports as one clear line (no traceback)."""

from __future__ import annotations


class UsageError(Exception):
    """A problem with the user's input (a field, a path), named in the message."""


class AllRolloutsFailed(RuntimeError):
    """Too many consecutive steps without a single successful rollout."""


class EnvironmentNotReady(RuntimeError):
    """An environment server did not come up: it exited during start-up, or did not answer in time."""


class RayHeadLost(RuntimeError):
    """The Ray head this trainer joined stopped answering or was replaced: without GCS fault tolerance
    Ray keeps no state across a head restart, so the attempt ends (its retry resumes from a checkpoint)."""
