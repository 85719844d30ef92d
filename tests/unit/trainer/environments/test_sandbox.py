"""The code checker's sandbox, with real processes: limits of CPU time, memory and wall-clock time, and no network."""

from __future__ import annotations

import socket
import time

from grpojob_trainer.environments.rewards.sandbox import Limits, run_sandboxed

LIMITS = Limits(cpu_seconds=1, memory_mb=256)


def test_a_program_runs_and_its_output_comes_back():
    ran = run_sandboxed("print(sum(range(10)))", LIMITS)
    assert (ran.returncode, ran.stdout) == (0, "45\n")


def test_the_network_is_refused_but_local_sockets_work():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        tcp = run_sandboxed(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)", LIMITS)
    unix = run_sandboxed("import socket\nsocket.socket(socket.AF_UNIX).close()\nprint('ok')", LIMITS)

    assert tcp.returncode == 1 and tcp.how == "exit code 1: PermissionError: [Errno 13] Permission denied"
    assert unix.stdout == "ok\n"


def test_memory_past_the_limit_is_refused():
    ran = run_sandboxed("data = bytearray(512 << 20)\nprint('allocated')", LIMITS)
    assert ran.returncode == 1 and ran.how == "exit code 1: MemoryError"
    assert "allocated" not in ran.stdout


def test_a_program_past_its_cpu_time_is_killed():
    began = time.monotonic()
    ran = run_sandboxed("while True:\n    pass", LIMITS)
    assert ran.returncode < 0 and ran.how == "killed: ran past its CPU time limit"
    assert time.monotonic() - began < 10


def test_a_program_that_sleeps_past_twice_its_cpu_time_is_killed():
    began = time.monotonic()
    ran = run_sandboxed("import subprocess, time\nsubprocess.Popen(['sleep', '60'])\ntime.sleep(60)", LIMITS)
    assert ran.timed_out and ran.how == "killed: ran past its time limit"
    assert time.monotonic() - began < 10
