"""The agent's client for the policy: chat completions and the model list over raw aiohttp JSON.

Like NeMo Gym's model servers, it posts plain JSON and reads plain JSON: the ``openai`` SDK's request
transformation, pydantic response parsing and retry wrappers took about half of the environment server's
CPU per rollout. Errors and retries follow the SDK's defaults: connection errors, timeouts, 408, 409, 429
and 5xx are retried twice with an exponential backoff (0.5 s, 1 s); then they raise `PolicyCallFailed`.
A 400 for the context length is `ContextLengthExceeded`; any other 4xx is `PolicyRefused`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

CONTEXT_LENGTH_MARKER = "maximum context length"
RETRY_STATUS = frozenset({408, 409, 429})
"""The 4xx statuses worth another attempt (as the ``openai`` SDK's ``_should_retry``); 5xx are too."""
MAX_RETRIES = 2
INITIAL_BACKOFF_S = 0.5
ERROR_BODY_CHARS = 1000


class PolicyRefused(Exception):
    """The policy answered 4xx for a reason other than context length (e.g. off-policy sampling)."""


class ContextLengthExceeded(PolicyRefused):
    """The policy answered 400: the prompt no longer fits its context."""


class PolicyCallFailed(Exception):
    """The policy could not be reached, timed out or answered 5xx (or 408/409/429), after the retries."""


def drop_none(value: Any) -> Any:
    """``value`` with the None-valued keys of every dict in it dropped, at any depth (list items stay).

    What ``model_dump(exclude_none=True)`` of the SDK's message gave for the message, its tool calls and
    their functions; unlike it, this also drops None inside free-form extra dicts, which servers do not send.
    """
    if isinstance(value, dict):
        return {k: drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_none(v) if isinstance(v, dict | list) else v for v in value]
    return value


def retryable(status: int) -> bool:
    """Whether an answer with ``status`` is worth another attempt."""
    return status in RETRY_STATUS or status >= 500


class PolicyClient:
    """The policy's OpenAI-compatible routes at ``base_url`` (ends in ``/v1``), on one aiohttp session.

    The session carries the timeout and the connection limit; the client adds the bearer token.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        api_key: str,
        *,
        max_retries: int = MAX_RETRIES,
        initial_backoff_s: float = INITIAL_BACKOFF_S,
    ) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.max_retries = max_retries
        self.initial_backoff_s = initial_backoff_s

    async def chat_completion(self, request: dict[str, Any]) -> dict[str, Any]:
        """POST ``request`` to ``/chat/completions``; the completion's JSON."""
        return await self._call("POST", "/chat/completions", request)

    async def first_model(self) -> str:
        """The id of the first model ``/models`` lists."""
        models = await self._call("GET", "/models", None)
        return models["data"][0]["id"]

    async def _call(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        """The decoded JSON answer, after up to ``max_retries`` retries of the transient failures."""
        url = self.base_url + path
        failure = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self.initial_backoff_s * 2 ** (attempt - 1))
            try:
                async with self.session.request(
                    method, url, json=body, headers=self.headers, allow_redirects=False
                ) as response:
                    status, raw = response.status, await response.read()
            except (aiohttp.ClientError, TimeoutError) as error:
                failure = f"{method} {url}: {type(error).__name__}" + (f": {error}" if str(error) else "")
                continue
            if 200 <= status < 300:
                try:
                    return json.loads(raw)
                except ValueError as error:
                    raise PolicyCallFailed(f"{method} {url} answered {status} with invalid JSON: {error}") from error
            text = raw.decode(errors="replace")
            if status == 400 and CONTEXT_LENGTH_MARKER in text:
                raise ContextLengthExceeded(text)
            failure = f"{method} {url} answered {status}: {text[:ERROR_BODY_CHARS]}"
            if 400 <= status < 500 and status not in RETRY_STATUS:
                raise PolicyRefused(f"the policy refused the request: {failure}")
            if not retryable(status):
                raise PolicyCallFailed(failure)
        raise PolicyCallFailed(f"{failure} (gave up after {self.max_retries + 1} attempts)")
