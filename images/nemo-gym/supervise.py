#!/usr/bin/env python3
"""Run a command in a process group of its own and stop the whole group when the pod is stopped.

    grpojob-supervise COMMAND [ARG ...]

NeMo Gym's ``ng_run`` (``gym env start``) stops its servers only on KeyboardInterrupt, and the
kubelet stops a container with SIGTERM, then SIGKILL after the pod's grace period. As the
container's first process this program starts COMMAND in a new session; on SIGTERM (or SIGINT) it
sends SIGINT to COMMAND's whole process group (``ng_run`` and every server it started), waits up to
``GRPOJOB_STOP_SECONDS`` (default 20: below Kubernetes' default grace period of 30 s) and then
kills whatever is left of the group. It reaps every orphan meanwhile, as a container's first process
must, and exits with COMMAND's status (128 + N when a signal N ended it). Before starting COMMAND it
raises its soft limit on open files to the hard limit (Ray and NeMo Gym's servers each hold many
sockets; container runtimes often set a soft limit of 1024). Standard library only: it runs with any
Python of the image.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys

STOP_SECONDS_VARIABLE = "GRPOJOB_STOP_SECONDS"
DEFAULT_STOP_SECONDS = 20


def stop_seconds() -> int:
    """How long the group may take to stop after SIGINT, from the environment."""
    value = os.environ.get(STOP_SECONDS_VARIABLE, str(DEFAULT_STOP_SECONDS))
    if not value.isdigit() or int(value) < 1:
        raise SystemExit(f"{STOP_SECONDS_VARIABLE} must be a whole number of seconds >= 1, not {value!r}")
    return int(value)


def signal_group(group: int, signum: int) -> None:
    """Send ``signum`` to process group ``group``, which may already be gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signum)


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (inherited by COMMAND); return it."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def supervise(command: list[str], seconds: int) -> int:
    """Run ``command`` until it exits; stop its group on SIGTERM/SIGINT; return its exit status."""
    raise_open_files_limit()
    child = subprocess.Popen(command, start_new_session=True)
    group = child.pid  # a new session's leader leads a process group of the same id

    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print(f"grpojob-supervise: {signal.Signals(signum).name}: stopping (SIGINT, {seconds}s)", flush=True)
        signal_group(group, signal.SIGINT)
        signal.alarm(seconds)

    def kill(signum: int, frame: object) -> None:
        print(f"grpojob-supervise: still running after {seconds}s: SIGKILL", flush=True)
        signal_group(group, signal.SIGKILL)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGALRM, kill)
    while True:
        pid, status = os.waitpid(-1, 0)  # also reaps orphans handed to us as PID 1
        if pid == child.pid:
            break
    signal.alarm(0)
    child.returncode = status = os.waitstatus_to_exitcode(status)
    signal_group(group, signal.SIGKILL)  # what the command left behind does not outlive it
    return 128 - status if status < 0 else status


def main(argv: list[str]) -> int:
    """The command line (see the module's docstring)."""
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    return supervise(argv, stop_seconds())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
