"""NeMo Gym's error bodies: which of its HTTP 500s wrap a client error (4xx) that no retry will fix.

A NeMo Gym server whose call to another server gets an error status answers HTTP 500 with a JSON string
body, ``"Hit an exception in <Class>___<instance> calling an inner server: b'<the inner body>'"``
(the exception middleware of ``nemo_gym/server_utils.py``, 0.4.0). Each hop wraps once more: a `/run`
whose model server got a 400 from the engine carries the agent's wrap around the model server's wrap
around the engine's body. The inner status is not in the text, so the innermost body tells: an OpenAI
or vLLM error object with a 4xx ``code``, or FastAPI's validation ``detail`` list (422).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from typing import Any

WRAP_PREFIX = "Hit an exception in "
WRAP_MIDDLE = " calling an inner server: "
VALIDATION_STATUS = 422


@dataclass(frozen=True)
class InnerClientError:
    """A 4xx that a NeMo Gym server got from a server it called, as it reached us through the wraps."""

    servers: tuple[str, ...]
    """The NeMo Gym servers that wrapped it, outermost first (``SimpleAgent___simple_agent``, ...)."""
    status: int
    message: str

    def __str__(self) -> str:
        return f"{' -> '.join(self.servers)} got HTTP {self.status} from the server it called: {self.message}"


def unwrap(text: str) -> tuple[str, str] | None:
    """One wrap taken off: ``(server, inner body)``, or None when ``text`` is not NeMo Gym's wrap."""
    if not (text.startswith(WRAP_PREFIX) and WRAP_MIDDLE in text):
        return None
    server, _, literal = text.removeprefix(WRAP_PREFIX).partition(WRAP_MIDDLE)
    try:
        inner = ast.literal_eval(literal)  # the inner body as Python printed it: a bytes literal
    except (ValueError, SyntaxError):
        return None
    if not isinstance(inner, bytes):
        return None
    return server, inner.decode(errors="replace")


def client_error_of(body: Any) -> tuple[int, str] | None:
    """``(status, message)`` when a decoded error body is a client error: an error object with a 4xx code
    (``{"error": {...}}`` as OpenAI and our server write it, or vLLM's flat ``{"object": "error", ...}``), or
    FastAPI's validation errors; else None."""
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("detail"), list):
        problems = [
            f"{'.'.join(str(part) for part in problem.get('loc', []))}: {problem.get('msg')}"
            for problem in body["detail"]
            if isinstance(problem, dict)
        ]
        return VALIDATION_STATUS, "; ".join(problems) or json.dumps(body["detail"])
    if isinstance(body.get("error"), dict):
        error = body["error"]
    elif body.get("object") == "error":
        error = body
    else:
        return None
    code = error.get("code")
    if isinstance(code, str) and code.isdigit():
        code = int(code)
    if isinstance(code, int) and 400 <= code < 500:
        return code, str(error.get("message", ""))
    return None


def error_message(body: str) -> str:
    """The message of an error body in OpenAI's shape (or FastAPI's validation errors); else the body as it is."""
    try:
        found = client_error_of(json.loads(body))
    except ValueError:
        return body
    return found[1] if found is not None else body


def inner_client_error(body: str) -> InnerClientError | None:
    """The client error that a NeMo Gym 500 body wraps (through any number of hops), or None when the body
    is not NeMo Gym's wrap or what it wraps is not a 4xx (a crash or a 5xx inside may be transient)."""
    servers: list[str] = []
    text = body
    while True:
        try:
            decoded = json.loads(text)
        except ValueError:
            return None
        if not isinstance(decoded, str):
            break
        unwrapped = unwrap(decoded)
        if unwrapped is None:
            return None
        server, text = unwrapped
        servers.append(server)
    found = client_error_of(decoded)
    if not servers or found is None:
        return None
    return InnerClientError(tuple(servers), *found)
