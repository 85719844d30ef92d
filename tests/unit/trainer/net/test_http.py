"""Waiting for a server's health URL: against real HTTP servers on loopback."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from grpojob_trainer.net.loopback import free_port, free_ports, wait_until_healthy


@contextmanager
def server_answering(status: int) -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/health"
    finally:
        server.shutdown()
        server.server_close()


def test_returns_once_the_url_answers_200():
    with server_answering(200) as url:
        wait_until_healthy(url, 30)


def test_a_url_that_answers_503_times_out_naming_the_url():
    with server_answering(503) as url, pytest.raises(TimeoutError, match=f"GET {url} did not answer 200"):
        wait_until_healthy(url, 0.3, interval_s=0.05)


def test_a_closed_port_times_out():
    url = f"http://127.0.0.1:{free_port()}/"
    with pytest.raises(TimeoutError, match="did not answer 200"):
        wait_until_healthy(url, 0.3, interval_s=0.05)


def test_the_check_ends_the_wait_with_its_error():
    def exited() -> None:
        raise RuntimeError("the server exited during start-up")

    with pytest.raises(RuntimeError, match="exited during start-up"):
        wait_until_healthy(f"http://127.0.0.1:{free_port()}/", 30, check=exited)


def test_ports_chosen_together_are_all_different():
    """Servers started side by side each get their own port (a free port asked twice may come back twice)."""
    ports = free_ports(32)
    assert len(set(ports)) == 32
