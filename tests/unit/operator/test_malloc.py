"""The operator's threads share two malloc arenas (glibc) instead of one arena each."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from grpojob_operator.malloc import limit_malloc_arenas

# Starts 12 threads that each allocate from the C heap, then prints how many arenas glibc's malloc_info lists.
COUNT_ARENAS = textwrap.dedent(
    """
    import ctypes, sys, tempfile, threading
    from grpojob_operator.malloc import limit_malloc_arenas
    if sys.argv[1] == "limited":
        assert limit_malloc_arenas()
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.fopen.restype = ctypes.c_void_p
    barrier = threading.Barrier(12)
    def allocate():
        pointer = libc.malloc(4096)  # below the mmap threshold: from the thread's arena
        barrier.wait()  # all alive at once, so none reuses an exited thread's arena
        libc.free(ctypes.c_void_p(pointer))
    threads = [threading.Thread(target=allocate) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with tempfile.NamedTemporaryFile(suffix=".xml") as report:
        stream = ctypes.c_void_p(libc.fopen(report.name.encode(), b"w"))
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        print(open(report.name).read().count("<heap nr="))
    """
)

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="malloc arenas are glibc's"
)


def arenas_after_twelve_threads(mode: str) -> int:
    env = {key: value for key, value in os.environ.items() if key != "MALLOC_ARENA_MAX"}
    result = subprocess.run(
        [sys.executable, "-c", COUNT_ARENAS, mode], env=env, capture_output=True, text=True, check=True
    )
    return int(result.stdout.strip())


@glibc_only
def test_twelve_threads_share_two_arenas_once_limited() -> None:
    assert arenas_after_twelve_threads("limited") <= 2


@glibc_only
def test_without_the_limit_threads_take_arenas_of_their_own() -> None:
    """The control: what the limit changes (glibc allows 8 arenas per core, so at least 8 here)."""
    assert arenas_after_twelve_threads("default") > 2


def test_an_explicit_malloc_arena_max_is_left_to_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas() is False


def test_a_limit_below_one_arena_is_refused() -> None:
    with pytest.raises(ValueError, match="arenas must be at least 1"):
        limit_malloc_arenas(0)
