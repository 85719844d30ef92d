"""Why a generation engine did not start, in one line a job's status can carry.

vLLM reports a failed start in its engine process as ``Engine core initialization failed. See root cause
above``: the cause is in that process's log, on the stdout and stderr it shares with the process that started
it. In a Ray worker those are log files in the worker's pod, so neither the trainer's log nor the job's status
would say why. `EngineStartWatch` notes where those logs and the container's out-of-memory kills stood before
the start; `EngineStartWatch.explain` reads what came after: the last exception the engine logged, and whether
the kernel killed a process of the container for memory meanwhile (as an engine's compile workers can be, in a
pod whose memory limit holds the engine and the policy together). An error that already says why (one raised
in this process, such as vLLM refusing a configuration) is left as it is.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from grpojob_trainer.errors import EngineCannotStart, EngineStartFailed

LOG_PREFIX = re.compile(
    r"^(?:\([^)]*\)\s+)?"  # vLLM's process tag, "(EngineCore_DP0 pid=123) "
    r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\S+\s+\S+\s+\[[^\]]*\]\s?)?"  # "ERROR 12-07 16:12:40 [core.py:7] "
)
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception|Exit)(?:\([\w.]*\))?(?::\s.*)?$")
MISSING_MODULE = re.compile(r"^(?:ModuleNotFoundError|ImportError)\b")
"""A cause a retry meets again: the image lacks a module the engine imports."""
WRAPPERS = ("Engine core initialization failed", "WorkerProc initialization failed", "See stack trace for root cause")
"""vLLM's own words for "the cause is in the log": the errors `explain` looks behind, and lines it skips there."""
LOG_TAIL_BYTES = 256 * 1024
OOM_EVENT_FILES = (
    Path("/sys/fs/cgroup/memory.events"),  # cgroup v2: the container's own, under a cgroup namespace
    Path("/sys/fs/cgroup/memory/memory.oom_control"),  # cgroup v1
)


def root_cause(log: str) -> str | None:
    """The last exception line in ``log`` (vLLM's process tags and log prefixes stripped) other than vLLM's
    own "see root cause above", or None."""
    for line in reversed(log.splitlines()):
        text = LOG_PREFIX.sub("", line.strip()).strip()
        if EXCEPTION_LINE.match(text) and not any(wrapper in text for wrapper in WRAPPERS):
            return text
    return None


def oom_kills(files: tuple[Path, ...] = OOM_EVENT_FILES) -> int | None:
    """Processes of this container the kernel has killed for memory (its memory cgroup's ``oom_kill``),
    or None where no such count can be read."""
    for path in files:
        try:
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def output_logs() -> list[Path]:
    """The regular files this process's stdout and stderr write to (a Ray worker's logs, a redirected run; vLLM
    logs to stdout, Python's tracebacks go to stderr), not a terminal or a pipe, whose reader sees them already."""
    found = []
    for descriptor in (1, 2):
        try:
            target = Path(os.readlink(f"/proc/self/fd/{descriptor}"))
        except OSError:
            continue
        if target.is_file() and target not in found:
            found.append(target)
    return found


@dataclass
class EngineStartWatch:
    """Where the output logs and the out-of-memory kills stood when an engine began to start."""

    log_offsets: dict[Path, int]
    oom_kills: int | None
    oom_files: tuple[Path, ...] = OOM_EVENT_FILES

    @classmethod
    def now(cls, oom_files: tuple[Path, ...] = OOM_EVENT_FILES) -> EngineStartWatch:
        offsets = {}
        for log in output_logs():
            try:
                offsets[log] = log.stat().st_size
            except OSError:
                continue
        return cls(log_offsets=offsets, oom_kills=oom_kills(oom_files), oom_files=oom_files)

    def logged_since(self) -> str:
        """What the output logs gained since the start began (the last ``LOG_TAIL_BYTES`` of each)."""
        text = []
        for log, offset in self.log_offsets.items():
            try:
                with log.open("rb") as file:
                    size = file.seek(0, os.SEEK_END)
                    file.seek(max(offset, size - LOG_TAIL_BYTES))
                    text.append(file.read().decode(errors="replace"))
            except OSError:
                continue
        return "\n".join(text)

    def explain(self, error: BaseException, engine: str = "vLLM") -> BaseException:
        """``error`` as one line that says why, when it is the engine's "see the log" (`WRAPPERS`): the last
        exception the engine logged, and processes of the container the kernel killed for memory meanwhile
        (with the field to raise); any other error as it is. A module the engine could not import (the image
        lacks it) comes back as `EngineCannotStart`: a retry would meet it again."""
        said = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if isinstance(error, ImportError):
            return EngineCannotStart(f"the {engine} engine did not start: {type(error).__name__}: {said}")
        if not any(wrapper in said for wrapper in WRAPPERS):
            return error
        found = []
        kills = oom_kills(self.oom_files)
        killed = kills is not None and self.oom_kills is not None and kills > self.oom_kills
        if killed:
            found.append(
                f"the kernel killed {kills - self.oom_kills} process(es) of its container for memory meanwhile; give "
                f"the pod more memory (spec.training.resources.memory, or spec.generation.resources.memory where "
                f"engines have pods of their own)"
            )
        cause = root_cause(self.logged_since())
        if cause is not None:
            found.append(cause)
        text = "; ".join(found) or f"{type(error).__name__}: {said}"
        missing_module = cause is not None and MISSING_MODULE.match(cause) is not None and not killed
        return (EngineCannotStart if missing_module else EngineStartFailed)(
            f"the {engine} engine did not start: {text}"
        )
