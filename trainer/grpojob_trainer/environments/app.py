"""One process serving an environment's agent (``/run``) and resources server routes.

Routes: ``GET /``, ``POST /run``, ``POST /seed_session``, ``POST /verify``, ``POST /<tool>`` for each
tool. Sessions use a signed cookie named ``<EnvironmentClass>___<name>``, re-issued on every response.
A malformed row (its task fields included: `Environment.task`) is refused with HTTP 422, FastAPI's and NeMo
Gym's status for a body that does not validate, in OpenAI's error shape naming the field.
The agent sends the resources routes exactly the requests NeMo Gym's agent sends, cookies included: over HTTP
to ``resources_url`` when it names another server, else to this server's own routes in process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from grpojob_trainer.environments.agent import (
    Agent,
    Cookies,
    HttpResources,
    LocalResources,
    ResourcesClient,
    ResourcesServerError,
)
from grpojob_trainer.environments.base import Environment, Tool, VerificationFailed
from grpojob_trainer.environments.policy_client import PolicyCallFailed, PolicyClient, PolicyRefused
from grpojob_trainer.environments.sessions import CookieSigner, SessionCookies, SessionStore
from grpojob_trainer.nemo_gym.protocol import EnvironmentRow, RunResult, VerifyRequest
from grpojob_trainer.net.http import StripRolloutPrefix, refuse_in_openai_shape


@dataclass(frozen=True)
class AgentConfig:
    """Where the agent finds the policy and the resources server."""

    policy_base_url: str
    """OpenAI base URL of the generation server (ends in ``/v1``), from ``POLICY_BASE_URL``."""
    resources_url: str | None = None
    """Root URL of another resources server; None: this server's own routes, called in process."""
    policy_model_name: str | None = None
    """``model`` sent to the policy when the row has none (default: the first of ``/v1/models``)."""
    policy_api_key: str = "dummy"
    policy_timeout_s: float = 600.0
    tool_timeout_s: float = 60.0
    """Limit on each call to a resources route (seed_session, a tool, verify)."""


def create_environment_app(environment: Environment, config: AgentConfig) -> FastAPI:
    """The FastAPI app hosting ``environment``'s agent and resources routes."""
    cookie_name = f"{type(environment).__name__}___{environment.name}"
    clients: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # aiohttp, not httpx (whose pool slows down quadratically with requests in flight), and raw JSON,
        # not the openai SDK (its request transformation and pydantic parsing cost half our CPU per rollout).
        policy = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),  # as many connections as rollouts in flight
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=config.policy_timeout_s),
        )
        policy_client = PolicyClient(policy, config.policy_base_url, config.policy_api_key)
        resources = None
        resources_client: ResourcesClient = LocalResources(app, config.tool_timeout_s)
        if config.resources_url is not None:
            resources = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),  # as many connections as rollouts in flight
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=config.tool_timeout_s),
            )
            resources_client = HttpResources(resources, config.resources_url)
        clients["agent"] = Agent(
            environment, policy_client, resources_client, policy_model_name=config.policy_model_name
        )
        yield
        if resources is not None:
            await resources.close()
        await policy.close()
        environment.stop()

    app = FastAPI(title=f"grpojob environment {environment.name}", lifespan=lifespan)

    app.add_middleware(SessionCookies, cookie_name=cookie_name, signer=CookieSigner(), sessions=SessionStore())
    app.add_middleware(StripRolloutPrefix)
    refuse_in_openai_shape(app, 422)

    def check_task(row: EnvironmentRow) -> None:
        """Refuse, as a malformed body, a row without the task fields the environment reads."""
        try:
            environment.task.model_validate(row.model_extra or {})
        except ValidationError as error:
            raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in error.errors()]) from None

    answer_agent_errors(app)

    @app.get("/")
    async def root() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/run")
    async def run(row: EnvironmentRow, request: Request) -> dict[str, Any]:
        check_task(row)
        result: RunResult = await clients["agent"].run(row, Cookies(dict(request.cookies)))
        return result.model_dump(mode="json", exclude_none=True)

    @app.post("/seed_session")
    async def seed_session(row: EnvironmentRow, request: Request) -> dict[str, Any]:
        request.state.session.clear()
        return {}

    @app.post("/verify")
    async def verify(body: VerifyRequest, request: Request) -> dict[str, Any]:
        check_task(body)
        echoed = body.model_dump(mode="json", exclude_none=True)
        verdict = await environment.score(echoed, echoed["response"], request.state.session)
        scored = {**echoed, **verdict.details, "reward": verdict.reward, "reward_components": verdict.components}
        result = RunResult.model_validate(scored)
        return result.model_dump(mode="json", exclude_none=True)

    for tool in environment.tools():
        app.add_api_route(f"/{tool.name}", _tool_route(tool), methods=["POST"], name=tool.name)
    return app


def answer_agent_errors(app: FastAPI) -> None:
    """How ``app`` answers a rollout that failed past the body: the policy refusing (400) or failing (502), a
    verification failing (422, in OpenAI's error shape), the resources server refusing (its answer) or failing
    (502)."""

    @app.exception_handler(PolicyRefused)
    async def policy_refused(_: Request, error: PolicyRefused) -> JSONResponse:
        return JSONResponse({"detail": str(error)}, status_code=400)

    @app.exception_handler(PolicyCallFailed)
    async def policy_failed(_: Request, error: PolicyCallFailed) -> JSONResponse:
        return JSONResponse({"detail": f"the policy call failed: {error}"}, status_code=502)

    @app.exception_handler(VerificationFailed)
    async def verification_failed(_: Request, error: VerificationFailed) -> JSONResponse:
        body = {"message": str(error), "type": "verification_failed", "code": 422}
        return JSONResponse({"error": body}, status_code=422)

    @app.exception_handler(ResourcesServerError)
    async def resources_failed(_: Request, error: ResourcesServerError) -> Response:
        if 400 <= error.status < 500:  # the resources server's refusal, as it gave it (retrying cannot help)
            return Response(error.body, status_code=error.status, media_type="application/json")
        return JSONResponse({"detail": str(error)}, status_code=502)


def _tool_route(tool: Tool) -> Any:
    async def call(request: Request) -> Any:
        try:
            arguments = await request.json()
        except ValueError:
            return JSONResponse({"error": "tool arguments must be a JSON object"}, status_code=400)
        if not isinstance(arguments, dict):
            return JSONResponse({"error": "tool arguments must be a JSON object"}, status_code=400)
        return await tool.handler(arguments, request.state.session)

    return call
