"""Run untrusted Python (a completion's code and a row's tests) in a subprocess with limits and no network.

The program runs in a fresh interpreter (``python -I``: no user site, no environment variables of ours, an
empty temporary working directory) that, before it reads the program, caps itself with rlimits (CPU time,
address space, file size, no core files) and installs a seccomp filter that refuses every socket but a
local (``AF_UNIX``) one and io_uring, so it reaches no network, with no privileges and whatever the
container's own seccomp profile allows (a user or network namespace would need privileges a pod seldom has).
Past its CPU time the kernel kills it; past twice that in wall-clock time (a program that sleeps) it is
killed with its process group. Linux on x86-64 or arm64 only: elsewhere every program fails, saying so.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

# The child's first statements: limits, then the filter, then the program from stdin. The filter's
# constants are for the machine it runs on (the syscall numbers of socket and io_uring_setup differ).
BOOTSTRAP = r"""
import ctypes, resource, struct, sys
cpu, memory, arch, socket_nr, uring_nr = (int(a) for a in sys.argv[1:6])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
program = sys.stdin.read()
ALLOW, DENY, KILL = 0x7FFF0000, 0x00050000 | 13, 0x80000000  # SECCOMP_RET_ALLOW, ERRNO(EACCES), KILL_PROCESS
LD, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06
filter = [
    (LD, 0, 0, 4), (JEQ, 1, 0, arch), (RET, 0, 0, KILL),  # another ABI: kill
    (LD, 0, 0, 0), (JGE, 6, 0, 0x40000000), (JEQ, 5, 0, uring_nr),  # x32 syscalls, io_uring: refuse
    (JEQ, 0, 3, socket_nr), (LD, 0, 0, 16), (JEQ, 1, 0, 1), (RET, 0, 0, DENY),  # socket(): AF_UNIX only
    (RET, 0, 0, ALLOW), (RET, 0, 0, DENY),
]
code = b"".join(struct.pack("HBBI", *f) for f in filter)
buffer = ctypes.create_string_buffer(code)
class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
prog = Program(len(filter), ctypes.addressof(buffer))
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # NO_NEW_PRIVS, SECCOMP
    sys.exit("sandbox: the seccomp filter could not be installed (errno %d)" % ctypes.get_errno())
del ctypes, resource, struct, buffer, prog, libc, Program, filter, code
__name__ = "__main__"
exec(compile(program, "<program>", "exec"))
"""

# (AUDIT_ARCH_*, socket, io_uring_setup) per machine.
ARCHITECTURES = {
    "x86_64": (0xC000003E, 41, 425),
    "aarch64": (0xC00000B7, 198, 425),
    "arm64": (0xC00000B7, 198, 425),
}
OUTPUT_CHARS = 4000


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 10
    memory_mb: int = 512


@dataclass(frozen=True)
class Ran:
    """How a program ended: its exit code (negative: the signal that killed it), its output (the end of it)
    and whether it was stopped for running too long."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def how(self) -> str:
        """One line on how it ended, for an error message."""
        if self.timed_out:
            return "killed: ran past its time limit"
        if self.returncode == -signal.SIGXCPU or self.returncode == -signal.SIGKILL:
            return "killed: ran past its CPU time limit"
        if self.returncode < 0:
            return f"killed by signal {signal.Signals(-self.returncode).name}"
        lines = [line for line in self.stderr.strip().splitlines() if line.strip()]
        return f"exit code {self.returncode}" + (f": {lines[-1].strip()}" if lines else "")


def run_sandboxed(program: str, limits: Limits) -> Ran:
    """Run ``program`` (Python source) under ``limits`` with no network; its output is cut to its end."""
    machine = ARCHITECTURES.get(platform.machine())
    if sys.platform != "linux" or machine is None:
        return Ran(1, "", f"the code sandbox runs on Linux x86-64 or arm64, not {sys.platform} {platform.machine()}")
    memory = limits.memory_mb << 20
    command = [sys.executable, "-I", "-S", "-c", BOOTSTRAP, str(limits.cpu_seconds), str(memory), *map(str, machine)]
    with tempfile.TemporaryDirectory(prefix="grpojob-sandbox-") as workdir:
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env={"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "PYTHONHASHSEED": "0"},
            start_new_session=True,
        )
        try:
            stdout, stderr = process.communicate(program.encode(errors="replace"), timeout=2 * limits.cpu_seconds + 1)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            timed_out = True
        finally:
            with contextlib.suppress(ProcessLookupError):  # what the program left running in its session
                os.killpg(process.pid, signal.SIGKILL)
    decode = lambda data: data.decode(errors="replace")[-OUTPUT_CHARS:]  # noqa: E731
    return Ran(process.returncode, decode(stdout), decode(stderr), timed_out)
