"""Nothing `grpojob run` starts outlives it, however it ends (SIGKILL included), on Linux.

`reap_children_at_exit` starts a watcher holding the read end of a pipe that only this process can
write to. The watcher records this process's descendants every second; when this process ends, the
kernel closes the pipe and the watcher kills every recorded process still running, and their children.

Why not less: Ray ties its GCS and raylet to the driver (PR_SET_PDEATHSIG), but the raylet's dashboard
and runtime-env agents then wait 60 s on the dead GCS before exiting (and overwrite their
``/proc/<pid>/environ`` with their title, so an inherited environment variable cannot find them); the
environment servers run in a session of their own, so that a terminal's Ctrl-C reaches `grpojob run`
(which stops them in order) rather than them, and nothing kills them when it dies.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

SNAPSHOT_INTERVAL_S = 1.0
THEN_TIMEOUT_S = 120.0


def reap_children_at_exit(then: Sequence[str] = ()) -> None:
    """Have every process this one starts (and their children) killed when this process ends, and then run the
    command ``then`` if one is given (for what is not a descendant: a container that podman's conmon runs)."""
    read_end, _write_end = os.pipe()  # not inheritable: only this process holds the write end
    subprocess.Popen(
        [sys.executable, "-m", __name__, str(os.getpid()), *then],
        stdin=read_end,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    os.close(read_end)


def _processes() -> dict[int, tuple[int, int]]:
    """Every living (not zombie) process: pid -> (parent pid, start time in clock ticks)."""
    table = {}
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                table[int(entry.name)] = (int(fields[1]), int(fields[19]))
    return table


def descendants(roots: set[int], table: dict[int, tuple[int, int]] | None = None) -> dict[int, int]:
    """pid -> start time of every living process descended from ``roots`` (the roots excluded)."""
    table = _processes() if table is None else table
    found: dict[int, int] = {}
    frontier = roots
    while frontier:
        frontier = {pid for pid, (parent, _) in table.items() if parent in frontier and pid not in found}
        found |= {pid: table[pid][1] for pid in frontier}
    return found


def kill_recorded(recorded: dict[int, int], rounds: int = 20) -> None:
    """SIGKILL the recorded processes still running (same pid and start time) and their descendants,
    again while new ones appear (a dying parent may still fork)."""
    for _ in range(rounds):
        table = _processes()
        alive = {pid for pid, started in recorded.items() if table.get(pid, (0, -1))[1] == started}
        targets = alive | set(descendants(alive, table))
        if not targets:
            return
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def main(parent: int, then: Sequence[str] = ()) -> None:
    """The watcher: record ``parent``'s descendants until the pipe on stdin closes, then kill them and run
    ``then``."""
    recorded: dict[int, int] = {}
    while not select.select([sys.stdin], [], [], SNAPSHOT_INTERVAL_S)[0]:
        recorded |= descendants({parent})
    recorded.pop(os.getpid(), None)
    kill_recorded(recorded)
    if then:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(then, capture_output=True, timeout=THEN_TIMEOUT_S, check=False)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
