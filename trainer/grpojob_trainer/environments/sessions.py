"""Signed-cookie sessions as NeMo Gym's resources servers use them, re-issued on every response."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import uuid
from collections import OrderedDict
from typing import Any


class CookieSigner:
    """Encodes ``{"session_id": ...}`` as ``base64(json).hmac`` and checks it on the way back."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or os.environ.get("SESSION_SECRET", "").encode() or os.urandom(32)

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
