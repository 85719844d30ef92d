"""The agent loop behind ``POST /run``: seed the session, run one episode against the policy, verify.

Like NeMo Gym's ``simple_agent``: the agent has no cookie jar; at every hop (run → seed_session →
each tool call → verify) it sends the cookies of the previous response. The resources routes are another
server's over HTTP (`HttpResources`), or this server's own, called in process with the same requests and
answers (`LocalResources`). The policy's chat completions
are called with plain JSON over aiohttp (`PolicyClient`); Responses items are converted to chat messages
and back (`grpojob_trainer.nemo_gym.responses`), so earlier assistant turns go back with their token ids.
"""

from __future__ import annotations

import asyncio
import http.cookies
import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from grpojob_trainer.environments.base import Environment
from grpojob_trainer.environments.policy_client import ContextLengthExceeded, PolicyClient, drop_none
from grpojob_trainer.nemo_gym.protocol import EpisodeResponse, ResponsesCreateParams, Row, RunResult
from grpojob_trainer.nemo_gym.responses import chat_to_output_items, chat_tools, input_items, responses_to_chat

logger = logging.getLogger(__name__)


@dataclass
class Episode:
    """State of one episode while it runs."""

    outputs: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=lambda: {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0})
    model_calls: int = 0
    incomplete: bool = False
    model: str = ""


class Cookies:
    """The agent's cookies: replaced wholesale by each response's ``Set-Cookie`` (when it sets any)."""

    def __init__(self, initial: dict[str, str] | None = None) -> None:
        self.values = dict(initial or {})

    def header(self) -> dict[str, str]:
        """Request headers carrying the current cookies."""
        return {"cookie": "; ".join(f"{k}={v}" for k, v in self.values.items())} if self.values else {}

    def update_from(self, cookies: Mapping[str, http.cookies.Morsel]) -> None:
        """Take the cookies a response set (its parsed ``Set-Cookie`` headers), if it set any."""
        if cookies:
            self.values = {name: morsel.value for name, morsel in cookies.items()}


class ResourcesServerError(Exception):
    """The resources server answered an error status."""

    def __init__(self, url: str, status: int, body: str) -> None:
        super().__init__(f"POST {url} answered {status}: {body[:500]}")
        self.status = status
        self.body = body


class ResourcesClient(Protocol):
    """The resources server's routes, as the agent calls them."""

    async def post(self, path: str, body: Any, cookies: Cookies, *, check: bool = True) -> str:
        """POST ``body`` as JSON with the episode's cookies, take the cookies the answer sets, and return
        its body; with ``check``, an error status raises `ResourcesServerError`."""
        ...


class HttpResources:
    """Another server's resources routes over HTTP. The session must have no cookie jar
    (``aiohttp.DummyCookieJar``): the agent carries each episode's cookies itself."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")

    async def post(self, path: str, body: Any, cookies: Cookies, *, check: bool = True) -> str:
        """POST ``body`` as JSON with the episode's cookies, take the cookies the answer sets, and return
        its body; with ``check``, an error status raises `ResourcesServerError`."""
        url = self.base_url + path
        async with self.session.post(url, json=body, headers=cookies.header()) as response:
            text = await response.text()
            if check and response.status >= 400:
                raise ResourcesServerError(url, response.status, text)
            cookies.update_from(response.cookies)
        return text


class LocalResources:
    """This server's own resources routes, called in process through its whole ASGI app (middleware, the
    session cookie, validation, error handlers): the request and the answer are those of an HTTP call to
    the server itself, without the socket and the HTTP parsing at both ends, which cost an environment
    server more CPU than the routes themselves."""

    def __init__(self, app: Any, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def post(self, path: str, body: Any, cookies: Cookies, *, check: bool = True) -> str:
        """As `HttpResources.post`."""
        payload = json.dumps(body).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        headers += [(name.encode(), value.encode("latin-1")) for name, value in cookies.header().items()]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 0),
        }
        sent = False
        status, answer_headers, chunks = 500, [], []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": payload, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status, answer_headers
            if message["type"] == "http.response.start":
                status, answer_headers = message["status"], message.get("headers", [])
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        try:
            async with asyncio.timeout(self.timeout_s):
                await self.app(scope, receive, send)
        except TimeoutError:
            raise
        except Exception:  # answered 500 already (Starlette's ServerErrorMiddleware); logged as uvicorn would
            logger.exception("Exception in ASGI application (POST %s, called in process)", path)
        text = b"".join(chunks).decode(errors="replace")
        if check and status >= 400:
            raise ResourcesServerError(path, status, text)
        set_cookies: http.cookies.SimpleCookie = http.cookies.SimpleCookie()
        for name, value in answer_headers:
            if name.lower() == b"set-cookie":
                set_cookies.load(value.decode("latin-1"))
        cookies.update_from(set_cookies)
        return text


class Agent:
    """Runs episodes of ``environment`` against the policy at ``policy``."""

    def __init__(
        self,
        environment: Environment,
        policy: PolicyClient,
        resources: ResourcesClient,
        *,
        policy_model_name: str | None = None,
    ) -> None:
        self.environment = environment
        self.policy = policy
        self.resources = resources
        self._model_name = policy_model_name

    async def run(self, row: Row, cookies: Cookies) -> RunResult:
        """``/run``: seed_session, the episode, verify; returns verify's answer (row + response + reward)."""
        body = row.model_dump(mode="json", exclude_none=True)
        await self.resources.post("/seed_session", body, cookies)
        response = await self.episode(row.responses_create_params, cookies)
        verify = {**body, "response": response.model_dump(mode="json", exclude_none=True)}
        return RunResult.model_validate_json(await self.resources.post("/verify", verify, cookies))

    async def episode(self, params: ResponsesCreateParams, cookies: Cookies) -> EpisodeResponse:
        """Call the model and the tools until the model answers without a tool call (or a limit).

        After a turn without tool calls the environment may continue the episode with a user message
        (`Environment.follow_up`); a truncated turn ends the episode unless the environment continues it.
        """
        items = input_items(params.input)
        episode = Episode(model=params.model or await self.model_name())
        tools = chat_tools(params.tools)
        while episode.model_calls < self.environment.max_model_calls:
            messages = responses_to_chat(items + episode.outputs, params.instructions)
            answer = await self._call_policy(params, messages, tools, episode)
            if answer is None:  # out of context: as Gym's model server, an empty truncated turn, no token ids
                episode.outputs.extend(chat_to_output_items({"role": "assistant", "content": None}, "length"))
                episode.incomplete = True
                break
            message, finish_reason = answer
            new_items = chat_to_output_items(message, finish_reason)
            episode.outputs.extend(new_items)
            episode.incomplete = finish_reason == "length"
            calls = [item for item in new_items if item["type"] == "function_call"] if not episode.incomplete else []
            for call in calls:
                output = await self._call_tool(call, cookies)
                episode.outputs.append({"type": "function_call_output", "call_id": call["call_id"], "output": output})
            if calls:
                continue
            if episode.model_calls >= self.environment.max_model_calls:
                break
            follow_up = self.environment.follow_up(episode.outputs, episode.model_calls, episode.incomplete)
            if follow_up is None:
                break
            episode.outputs.append({"type": "message", "role": "user", "content": follow_up})
        return self._response(params, episode)

    async def model_name(self) -> str:
        """The policy's model name: configured, else the first model the server lists."""
        if self._model_name is None:
            self._model_name = await self.policy.first_model()
        return self._model_name

    async def _call_policy(
        self, params: ResponsesCreateParams, messages: list[dict[str, Any]], tools: Any, episode: Episode
    ) -> tuple[dict[str, Any], str] | None:
        """The model's message (None-valued keys dropped) and finish reason; None when the prompt no longer
        fits the context. Raises `PolicyRefused` for another 4xx, `PolicyCallFailed` when the retries fail."""
        request: dict[str, Any] = {"model": episode.model, "messages": messages}
        optional = {
            "tools": tools,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_output_tokens,
            "metadata": params.metadata,  # as NeMo Gym passes it: an evaluation's mark rides here
        }
        request.update({k: v for k, v in optional.items() if v is not None})
        try:
            completion = await self.policy.chat_completion(request)
        except ContextLengthExceeded:
            return None
        episode.model_calls += 1
        usage = completion.get("usage")
        if usage is not None:
            episode.usage["input_tokens"] += usage["prompt_tokens"]
            episode.usage["output_tokens"] += usage["completion_tokens"]
            episode.usage["total_tokens"] += usage["total_tokens"]
        choice = completion["choices"][0]
        return drop_none(choice["message"]), choice.get("finish_reason") or "stop"

    async def _call_tool(self, call: dict[str, Any], cookies: Cookies) -> str:
        """POST the decoded arguments to the tool route; the raw body text, whatever the status, is the output."""
        try:
            arguments = json.loads(call["arguments"])
        except json.JSONDecodeError as error:
            return json.dumps({"error": f"Invalid tool call arguments: {error}"})
        return await self.resources.post(f"/{call['name']}", arguments, cookies, check=False)

    def _response(self, params: ResponsesCreateParams, episode: Episode) -> EpisodeResponse:
        return EpisodeResponse(
            id=f"resp_{uuid.uuid4().hex}",
            created_at=int(time.time()),
            model=episode.model,
            output=episode.outputs,
            status="incomplete" if episode.incomplete else "completed",
            incomplete_details={"reason": "max_output_tokens"} if episode.incomplete else None,
            usage=episode.usage,
            tools=params.tools or [],
            tool_choice=params.tool_choice,
            parallel_tool_calls=params.parallel_tool_calls,
            temperature=params.temperature,
            top_p=params.top_p,
            max_output_tokens=params.max_output_tokens,
        )
