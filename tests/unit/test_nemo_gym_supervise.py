"""The NeMo Gym image's entrypoint (images/nemo-gym/supervise.py), run here on real processes: a
command that starts a server of its own, as `gym env start` does, and a pod stop (SIGTERM)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SUPERVISE = Path(__file__).parents[2] / "images" / "nemo-gym" / "supervise.py"

# A parent and its child, each writing `ready` and then, on SIGINT, `interrupted` to a file of its own.
SERVERS = textwrap.dedent(
    """
    import pathlib, signal, subprocess, sys, time
    out, role, ignore = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "ignore"
    def interrupted(signum, frame):
        (out / role).write_text("interrupted")
        sys.exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN if ignore else interrupted)
    child = None
    if role == "parent":
        child = subprocess.Popen([sys.executable, __file__, str(out), "child", sys.argv[3]])
    (out / role).write_text("ready")
    while True:
        time.sleep(0.1)
    """
)


def start(tmp_path: Path, ignore_sigint: bool = False, stop_seconds: str = "30") -> subprocess.Popen:
    script = tmp_path / "servers.py"
    script.write_text(SERVERS)
    command = [sys.executable, str(SUPERVISE), sys.executable, str(script), str(tmp_path), "parent"]
    command.append("ignore" if ignore_sigint else "handle")
    env = {**os.environ, "GRPOJOB_STOP_SECONDS": stop_seconds}
    supervisor = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not all((tmp_path / role).exists() for role in ("parent", "child")):
        assert time.monotonic() < deadline and supervisor.poll() is None, "the servers did not start"
        time.sleep(0.05)
    return supervisor


def server_pids(tmp_path: Path) -> list[int]:
    """The processes still running the test's servers script."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(tmp_path / "servers.py").encode() in (proc / "cmdline").read_bytes():
                status = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if status != "Z":
                    found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_sigterm_interrupts_the_command_and_what_it_started_and_exits_with_its_status(tmp_path: Path):
    supervisor = start(tmp_path)
    supervisor.send_signal(signal.SIGTERM)
    output, _ = supervisor.communicate(timeout=60)
    assert supervisor.returncode == 0, output
    assert (tmp_path / "parent").read_text() == "interrupted"
    assert (tmp_path / "child").read_text() == "interrupted"
    assert "SIGTERM: stopping" in output
    assert server_pids(tmp_path) == []


def test_a_command_that_ignores_sigint_is_killed_after_the_stop_seconds(tmp_path: Path):
    supervisor = start(tmp_path, ignore_sigint=True, stop_seconds="1")
    supervisor.send_signal(signal.SIGTERM)
    output, _ = supervisor.communicate(timeout=60)
    assert supervisor.returncode == 128 + signal.SIGKILL, output
    assert "SIGKILL" in output
    assert (tmp_path / "parent").read_text() == (tmp_path / "child").read_text() == "ready"
    assert server_pids(tmp_path) == []


@pytest.mark.parametrize("status", [0, 3])
def test_the_command_exit_status_is_the_supervisor_s(status: int):
    done = subprocess.run([sys.executable, str(SUPERVISE), "sh", "-c", f"exit {status}"], timeout=60, check=False)
    assert done.returncode == status


def test_a_bad_stop_seconds_names_the_variable():
    env = {**os.environ, "GRPOJOB_STOP_SECONDS": "soon"}
    done = subprocess.run(
        [sys.executable, str(SUPERVISE), "true"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode != 0 and "GRPOJOB_STOP_SECONDS" in done.stderr


def test_the_command_may_open_as_many_files_as_the_hard_limit_allows():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = min(soft, 256)

    def lower_soft_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))

    show_limits = "import resource; print(*resource.getrlimit(resource.RLIMIT_NOFILE))"
    shown = subprocess.run(
        [sys.executable, str(SUPERVISE), sys.executable, "-c", show_limits],
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=lower_soft_limit,
    )
    assert shown.stdout.split() == [str(hard), str(hard)]
