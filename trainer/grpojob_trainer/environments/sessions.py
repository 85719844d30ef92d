"""Signed-cookie sessions as NeMo Gym's resources servers use them, re-issued on every response."""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.cookies
import json
import os
import uuid
from collections import OrderedDict
from typing import Any

from starlette.requests import cookie_parser

from grpojob_api import endpoints


class CookieSigner:
    """Encodes ``{"session_id": ...}`` as ``base64(json).hmac`` and checks it on the way back."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or os.environ.get(endpoints.SESSION_SECRET, "").encode() or os.urandom(32)

    def dump(self, session_id: str) -> str:
        """The cookie value for ``session_id``."""
        payload = base64.urlsafe_b64encode(json.dumps({"session_id": session_id}).encode()).decode()
        return f"{payload}.{self._sign(payload)}"

    def load(self, cookie: str | None) -> str | None:
        """The session id in a cookie value, or None when it is missing or its signature is wrong."""
        if not cookie or "." not in cookie:
            return None
        payload, signature = cookie.rsplit(".", 1)
        if not hmac.compare_digest(signature, self._sign(payload)):
            return None
        try:
            return str(json.loads(base64.urlsafe_b64decode(payload))["session_id"])
        except (ValueError, KeyError, TypeError):
            return None

    def _sign(self, payload: str) -> str:
        return hmac.new(self._secret, payload.encode(), hashlib.sha256).hexdigest()


class SessionStore:
    """Per-session state (a dict each), keeping the newest ``max_sessions``."""

    def __init__(self, max_sessions: int = 100_000) -> None:
        self._sessions: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.max_sessions = max_sessions

    def get(self, session_id: str) -> dict[str, Any]:
        """The state of ``session_id`` (created empty on first use)."""
        state = self._sessions.pop(session_id, None)
        self._sessions[session_id] = state if state is not None else {}
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return self._sessions[session_id]


def new_session_id() -> str:
    """A fresh session id (uuid4, as Gym uses)."""
    return str(uuid.uuid4())


class SessionCookies:
    """ASGI middleware: each request's session (from its signed cookie ``cookie_name``, else a new one) in
    ``request.state.session``, and the cookie re-issued on every response (HttpOnly, SameSite=lax).

    A plain ASGI middleware rather than ``@app.middleware("http")``: Starlette's `BaseHTTPMiddleware` runs
    every request through extra tasks and streams, a measurable share of an environment server's time
    with hundreds of rollouts in flight."""

    def __init__(self, app: Any, *, cookie_name: str, signer: CookieSigner, sessions: SessionStore) -> None:
        self.app = app
        self.cookie_name = cookie_name
        self.signer = signer
        self.sessions = sessions

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cookie_header = next((value for name, value in scope["headers"] if name == b"cookie"), b"")
        cookies = cookie_parser(cookie_header.decode("latin-1"))
        session_id = self.signer.load(cookies.get(self.cookie_name)) or new_session_id()
        scope.setdefault("state", {})["session"] = self.sessions.get(session_id)
        set_cookie = self._set_cookie_header(session_id)

        async def send_with_cookie(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", set_cookie)]}
            await send(message)

        await self.app(scope, receive, send_with_cookie)

    def _set_cookie_header(self, session_id: str) -> bytes:
        cookie: http.cookies.SimpleCookie = http.cookies.SimpleCookie()
        cookie[self.cookie_name] = self.signer.dump(session_id)
        cookie[self.cookie_name]["path"] = "/"
        cookie[self.cookie_name]["httponly"] = True
        cookie[self.cookie_name]["samesite"] = "lax"
        return cookie.output(header="").strip().encode("latin-1")
