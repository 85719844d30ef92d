"""Loopback plumbing for our servers, their clients and the test tooling: a free port, and waiting until a
server's health URL answers. The standard library alone, so that the test cluster's tooling (`grpojob_testing`)
runs where none of the servers' packages is installed yet.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import time
import urllib.request
from collections.abc import Callable


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` different TCP ports that were free a moment ago on ``host`` (all bound at once while chosen:
    `free_port` called twice may give the same port twice)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]


def answers(url: str, *, timeout_s: float = 2.0, context: ssl.SSLContext | None = None) -> bool:
    """True when ``GET url`` answers 200; False when it cannot connect, times out or answers otherwise."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as response:
            return response.status == 200
    except (OSError, http.client.HTTPException):
        return False


def wait_until_healthy(
    url: str,
    timeout_s: float,
    *,
    check: Callable[[], None] | None = None,
    context: ssl.SSLContext | None = None,
    interval_s: float = 0.2,
) -> None:
    """Poll ``GET url`` until it answers 200, or raise `TimeoutError` naming it and the time waited after
    ``timeout_s``.

    ``check`` runs before each attempt and raises to stop waiting (for a server process that exited during
    start-up); ``context`` is the TLS context for ``https`` URLs.
    """
    start = time.monotonic()
    deadline = start + timeout_s
    while True:
        if check is not None:
            check()
        if answers(url, context=context):
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"GET {url} did not answer 200 within {time.monotonic() - start:.0f}s")
        time.sleep(interval_s)
