"""Errors the `grpojob` command reports as one clear line (no traceback), and how a value that does not
validate is worded, field by field (`problem`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class UsageError(Exception):
    """A problem with the user's input (a field, a path), named in the message."""


class AllRolloutsFailed(RuntimeError):
    """Too many consecutive steps without a single successful rollout."""


class EnvironmentNotReady(RuntimeError):
    """An environment server did not come up: it exited during start-up, or did not answer in time."""


class CannotRun(RuntimeError):
    """The job cannot run as it is specified or packaged (its image lacks a module its engine needs, its policy
    does not fit its GPU): a retry would fail the same way. The trainer exits with `CANNOT_RUN_EXIT_CODE`, and
    the operator fails the job at once."""


class EngineStartFailed(RuntimeError):
    """A generation engine did not start; the message says why in one line (`generation.engine_start`)."""


class EngineCannotStart(EngineStartFailed, CannotRun):
    """A generation engine did not start for a reason a retry meets again: its image lacks a module."""


def cannot_run(error: BaseException | None) -> CannotRun | None:
    """The `CannotRun` behind ``error``: itself, what it was raised from, or what a Ray worker raised (Ray's
    task error carries it as ``cause``)."""
    while error is not None:
        cause = getattr(error, "cause", None)
        if isinstance(cause, CannotRun):
            return cause
        if isinstance(error, CannotRun):
            return error
        error = error.__cause__
    return None


class RayHeadLost(RuntimeError):
    """The Ray head this trainer joined stopped answering or was replaced: without GCS fault tolerance
    Ray keeps no state across a head restart, so the attempt ends (its retry resumes from a checkpoint)."""


def field_path(loc: Sequence[int | str]) -> str:
    """A pydantic error location as a field path: ``("messages", 0, "role")`` → ``messages[0].role``."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else ("." if path else "") + str(part)
    return path


def problem(error: Mapping[str, Any]) -> str:
    """One of pydantic's errors as ``field.path: message`` (the message alone for the whole body)."""
    message = error["msg"].removeprefix("Value error, ")
    return f"{field_path(error['loc'])}: {message}" if error["loc"] else message
