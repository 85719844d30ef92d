"""HTTP plumbing shared by our servers and the tests: refusals in OpenAI's error shape (a validation error worded
field by field), NeMo Gym's rollout path prefix stripped, and in-thread serving.

It imports nothing of ours but `errors` and `loopback`: every layer above may use it.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from grpojob_trainer.errors import field_path, problem
from grpojob_trainer.net.loopback import free_port


class ApiError(Exception):
    """A refused request, answered in OpenAI's error shape (`error_response`)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    """OpenAI's error object, ``{"error": {"message", "type": "invalid_request_error", "param", "code"}}``,
    with the HTTP status as ``code`` (as vLLM writes it, and as `grpojob_trainer.nemo_gym.errors` reads it)."""
    body = {"message": message, "type": "invalid_request_error", "param": param, "code": status}
    return JSONResponse({"error": body}, status_code=status)


def refuse_in_openai_shape(app: FastAPI, invalid_status: int) -> None:
    """Answer `ApiError` and every malformed body with `error_response`: a body that does not validate (not
    JSON, or not the route's model) gets ``invalid_status``, its message names each offending field and its
    ``param`` the first."""

    @app.exception_handler(ApiError)
    async def refused(_: Request, error: ApiError) -> JSONResponse:
        return error_response(error.status, error.message, error.param)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        problems = [{**e, "loc": tuple(e["loc"])[1:]} for e in error.errors()]  # under "body"
        first = problems[0]
        if first["type"] == "json_invalid":
            return error_response(invalid_status, f"the body is not JSON: {first.get('ctx', {}).get('error')}")
        return error_response(invalid_status, "; ".join(map(problem, problems)), field_path(first["loc"]) or None)


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
