"""The C allocator's arenas: the operator's threads share a few instead of one each.

glibc gives every thread that allocates its own malloc arena, up to eight per core. The operator runs
about 200 threads (reconcile passes, their writes, the API connections' reads), so on 2 cores it holds 16
arenas, each keeping the freed pieces of the large buffers (HTTP bodies, decoded JSON) its threads once
held. Every thread waits on the API server, not on the allocator, so sharing two arenas costs nothing
measurable and keeps the freed memory reusable by all. This is what ``MALLOC_ARENA_MAX=2`` does, set from
inside the process so that it holds however the operator is started; an explicit ``MALLOC_ARENA_MAX`` in
the environment is left to glibc.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

M_ARENA_MAX = -8
"""glibc's ``mallopt`` parameter for the arena limit (``malloc.h``)."""
OPERATOR_ARENAS = 2


def limit_malloc_arenas(arenas: int = OPERATOR_ARENAS) -> bool:
    """Limit glibc's malloc arenas to ``arenas`` for the threads started from now on; call it before starting
    threads. Returns whether the limit was set: not where ``MALLOC_ARENA_MAX`` is already in the environment,
    and not on a C library without ``mallopt`` (musl, macOS)."""
    if arenas < 1:
        raise ValueError(f"arenas must be at least 1, got {arenas}")
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        log.debug("no mallopt in this C library: malloc arenas left as they are")
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt(M_ARENA_MAX, arenas) == 1
