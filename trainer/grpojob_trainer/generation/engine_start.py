"""Why a generation engine did not start, in one line a job's status can carry.

vLLM reports a failed start as ``Engine core initialization failed. See root cause above``: the cause is in
its engine process's log, on the stderr it shares with the process that started it. In a Ray worker that
stderr is a log file in the worker's pod, so neither the trainer's log nor the job's status would say
why. `EngineStartWatch` notes where that log and the container's out-of-memory kills stood before the
start; `EngineStartWatch.explain` reads what came after: the last exception the engine logged, or that
the kernel killed a process of the container for memory (as an engine's compile workers can be, in a pod
whose memory limit holds the engine and the policy together).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from grpojob_trainer.errors import EngineStartFailed

LOG_PREFIX = re.compile(
    r"^(?:\([^)]*\)\s+)?"  # vLLM's process tag, "(EngineCore_DP0 pid=123) "
    r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\S+\s+\S+\s+\[[^\]]*\]\s?)?"  # "ERROR 12-07 16:12:40 [core.py:7] "
)
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit)(?::\s.*)?$")
VLLM_WRAPPER = "Engine core initialization failed"
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
        if EXCEPTION_LINE.match(text) and VLLM_WRAPPER not in text:
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


def stderr_log() -> Path | None:
    """The regular file this process's stderr writes to (a Ray worker's log, a redirected run), or None
    (a terminal or a pipe, whose reader sees the engine's log already)."""
    try:
        target = Path(os.readlink("/proc/self/fd/2"))
    except OSError:
        return None
    return target if target.is_file() else None


@dataclass
class EngineStartWatch:
    """Where the stderr log and the out-of-memory kills stood when an engine began to start."""

    log: Path | None
    log_offset: int
    oom_kills: int | None
    oom_files: tuple[Path, ...] = OOM_EVENT_FILES

    @classmethod
    def now(cls, oom_files: tuple[Path, ...] = OOM_EVENT_FILES) -> EngineStartWatch:
        log = stderr_log()
        offset = log.stat().st_size if log is not None else 0
        return cls(log=log, log_offset=offset, oom_kills=oom_kills(oom_files), oom_files=oom_files)

    def logged_since(self) -> str:
        """What the stderr log gained since the start began (its last ``LOG_TAIL_BYTES``)."""
        if self.log is None:
            return ""
        try:
            with self.log.open("rb") as file:
                size = file.seek(0, os.SEEK_END)
                file.seek(max(self.log_offset, size - LOG_TAIL_BYTES))
                return file.read().decode(errors="replace")
        except OSError:
            return ""

    def explain(self, error: BaseException, engine: str = "vLLM") -> EngineStartFailed:
        """``error`` (the engine's own) as one line that says why: memory when the container lost processes
        to the kernel's out-of-memory killer meanwhile, else the last exception the engine logged."""
        kills = oom_kills(self.oom_files)
        said = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if kills is not None and self.oom_kills is not None and kills > self.oom_kills:
            return EngineStartFailed(
                f"the {engine} engine did not start: the kernel killed {kills - self.oom_kills} process(es) of its "
                f"container for memory meanwhile; give the pod more memory (spec.training.resources.memory, or "
                f"spec.generation.resources.memory where engines have pods of their own) ({engine}: {said})"
            )
        cause = root_cause(self.logged_since())
        if cause is not None:
            return EngineStartFailed(f"the {engine} engine did not start: {cause}")
        return EngineStartFailed(f"the {engine} engine did not start: {type(error).__name__}: {said}")
