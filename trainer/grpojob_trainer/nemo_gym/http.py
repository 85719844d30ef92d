"""HTTP plumbing shared by our NeMo Gym-speaking servers: path-prefix stripping and in-thread serving."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import uvicorn

from grpojob_trainer.ray_runtime.net import free_port

ROLLOUT_PREFIX = re.compile(r"^/ng-rollout/[^/]+(/training-token-capture)?(?=/|$)")
"""NeMo Gym may prefix calls with ``/ng-rollout/<rollout_id>`` (and ``/training-token-capture``)."""


def strip_rollout_prefix(path: str) -> str:
    """``/ng-rollout/abc/v1/chat/completions`` → ``/v1/chat/completions``; other paths unchanged."""
    stripped = ROLLOUT_PREFIX.sub("", path, count=1)
    return stripped or "/"


class StripRolloutPrefix:
    """ASGI middleware that routes ``/ng-rollout/<id>/...`` as if the prefix were absent (as Gym does)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/ng-rollout/"):
            scope = dict(scope, path=strip_rollout_prefix(scope["path"]))
            scope["raw_path"] = scope["path"].encode()
        await self.app(scope, receive, send)


class ThreadedServer:
    """A uvicorn server on a background thread (for in-process use: Ray actors, tests, local mode).

    ``with ThreadedServer(app, port=...) as server: ... server.url ...``
    """

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int | None = None, log_level: str = "warning"):
        self.host = host
        self.port = port or free_port(host)
        config = uvicorn.Config(
            app, host=host, port=self.port, log_level=log_level, timeout_graceful_shutdown=1, lifespan="on"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name=f"uvicorn-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        """Base URL, without a trailing slash."""
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> ThreadedServer:
        """Start serving and wait until the socket accepts connections."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the server on port {self.port} exited during startup")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server on port {self.port} did not start within {timeout_s}s")
            time.sleep(0.02)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask uvicorn to exit and wait for the thread."""
        self._server.should_exit = True
        self._thread.join(timeout_s)

    def __enter__(self) -> ThreadedServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
