"""The OpenAI-compatible generation server (FastAPI) in front of a `GenerationBackend`.

Routes: ``POST /v1/chat/completions``, ``POST /tokenize``, ``GET /v1/models``, ``GET /health``.
Completions are `openai`'s own types; ``choices[0].message`` also carries the call's `TokenIds`
(``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs``: NeMo Gym's contract) and
the completion its ``weights_version``. Sampling is on-policy: a request that leaves out
``temperature`` or ``top_p`` samples with the server's (NeMo Gym forwards only what a row sets); one that
sends a different value, or asks for what plain sampling does not do (stop sequences, penalties, ...), is
refused. Every refusal, a malformed body included, is HTTP 400 in OpenAI's error shape naming the field.
"""

from __future__ import annotations

import hmac
import math
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import FastAPI
from openai.types.chat import ChatCompletion, ChatCompletionMessage, ChatCompletionTokenLogprob
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.completion_usage import CompletionUsage
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from grpojob_trainer.generation.backend import (
    ContinuousBatchingBackend,
    GenerationBackend,
    GenerationRequest,
    SamplingParams,
)
from grpojob_trainer.generation.batching import BatchingEngine, DirectEngine
from grpojob_trainer.generation.chat import PromptError, build_prompt_token_ids, parse_tool_calls
from grpojob_trainer.nemo_gym.protocol import EVALUATION_MARK, RequestBody, TextContent, TokenIds, shaped_like
from grpojob_trainer.net.http import ApiError, StripRolloutPrefix, refuse_in_openai_shape

SAMPLING_TOLERANCE = 1e-6
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "stop": (None, "", []),
    "frequency_penalty": (None, 0),
    "presence_penalty": (None, 0),
    "logit_bias": (None, {}),
    "response_format": (None, {"type": "text"}),
    "top_logprobs": (None, 0),
    "tool_choice": (None, "auto"),
}
"""Request parameters this server does not honour, with the values that ask for nothing (taken)."""


@dataclass(frozen=True)
class EvaluationSampling:
    """How the requests of evaluation rollouts (`spec.evaluation`) sample, and the secret that marks them."""

    token: str = field(repr=False)
    """A request whose ``metadata`` carries this under `EVALUATION_MARK` is an evaluation's (kept out of the
    repr: configs are logged)."""
    sampling: SamplingParams


@dataclass(frozen=True)
class ServerConfig:
    """What the server answers to and how it samples."""

    served_model_name: str
    sampling: SamplingParams
    """Training's sampling parameters: every request samples with them; one that names another
    temperature or top_p is refused."""
    batch_window_s: float = 0.01
    max_batch_size: int = 64
    evaluation: EvaluationSampling | None = None
    """The evaluation's sampling, for requests marked with its token; none: every request is training's."""


class FunctionCall(BaseModel):
    """The function a tool call names, with its arguments as a JSON string."""

    name: str
    arguments: str


class ToolCall(BaseModel):
    """A tool call of an earlier assistant message."""

    model_config = ConfigDict(extra="allow")

    id: str
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(BaseModel):
    """A chat message as this server takes it (other keys, such as an earlier turn's token ids, pass through)."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: TextContent = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDefinition(BaseModel):
    """A function the model may call."""

    model_config = ConfigDict(extra="allow")

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ChatTool(BaseModel):
    """A chat-completions tool: ``{"type": "function", "function": {...}}``."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"]
    function: FunctionDefinition


Messages = list[Annotated[dict[str, Any], shaped_like(ChatMessage)]]
"""Chat messages, each checked against `ChatMessage` and kept as sent (the chat template reads them)."""
Tools = list[Annotated[dict[str, Any], shaped_like(ChatTool)]]


class ChatCompletionRequest(RequestBody):
    """The parts of an OpenAI chat-completions request this server reads (other keys pass unread, but those of
    `UNSUPPORTED` must ask for nothing)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: Messages = Field(min_length=1)
    tools: Tools | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int | None = 1
    stream: StrictBool | None = False
    logprobs: StrictBool | None = None
    """A JSON boolean, as OpenAI's API takes it (a string such as "false" would read as true)."""
    metadata: dict[str, str] | None = None
    """Passed through from the row; `EVALUATION_MARK` in it marks an evaluation rollout's call."""


class TokenizeRequest(RequestBody):
    """vLLM's ``/tokenize`` body: chat ``messages`` (with ``tools``) or a plain ``prompt``."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: Messages | None = None
    tools: Tools | None = None
    prompt: str | None = None
    add_generation_prompt: bool = True


def request_sampling(request: ChatCompletionRequest, config: ServerConfig) -> tuple[SamplingParams, str]:
    """How ``request`` samples, and for what: training's parameters (``"training"``), or the evaluation's
    (``"evaluation"``) when its ``metadata`` carries this run's evaluation token under `EVALUATION_MARK`. A
    mark without the token is refused: a training request cannot pass as an evaluation's."""
    mark = (request.metadata or {}).get(EVALUATION_MARK)
    if mark is None:
        return config.sampling, "training"
    evaluation = config.evaluation
    if evaluation is None or not hmac.compare_digest(mark.encode(), evaluation.token.encode()):
        raise ApiError(
            400,
            f"metadata.{EVALUATION_MARK} is not this run's evaluation token: only the trainer's evaluation "
            "rollouts sample with other parameters than training's",
            f"metadata.{EVALUATION_MARK}",
        )
    return evaluation.sampling, "evaluation"


def check_on_policy(request: ChatCompletionRequest, sampling: SamplingParams, purpose: str = "training") -> None:
    """Refuse sampling parameters that differ from ``sampling``, training's (NeMo-RL's rule) or, for a marked
    evaluation request, the evaluation's; absent ones mean those."""
    for name, expected in (("temperature", sampling.temperature), ("top_p", sampling.top_p)):
        value = getattr(request, name)
        if value is not None and not math.isclose(value, expected, rel_tol=0, abs_tol=SAMPLING_TOLERANCE):
            raise ApiError(
                400,
                f"{name}={value} differs from the {purpose} {name}={expected}: "
                "this server samples on-policy and refuses other sampling parameters",
                name,
            )
    if request.top_k not in (None, -1, 0):
        raise ApiError(400, f"top_k={request.top_k} is not supported on-policy: leave it unset or -1", "top_k")
    if request.n not in (None, 1):
        raise ApiError(400, f"n={request.n} is not supported: send one request per sample (n=1)", "n")
    if request.stream:
        raise ApiError(400, "stream=true is not supported", "stream")
    for name, nothing in UNSUPPORTED.items():
        value = (request.model_extra or {}).get(name)
        if value not in nothing:
            raise ApiError(
                400,
                f"{name}={value!r} is not supported: this server samples plainly at the training temperature and "
                "top_p, and returns the sampled tokens' log-probs only; leave it out",
                name,
            )


def token_budget(request: ChatCompletionRequest, prompt_len: int, sampling: SamplingParams, max_model_len: int) -> int:
    """Tokens this request may generate: its own limit capped by the server's and the context left. A limit beyond
    the model's whole context is refused: it could never be what the request gets."""
    if prompt_len >= max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{prompt_len} input tokens. Please reduce the length of the input messages.",
            "messages",
        )
    for name in ("max_completion_tokens", "max_tokens"):
        value = getattr(request, name)
        if value is not None and value > max_model_len:
            raise ApiError(
                400,
                f"{name}={value} is more than this model's maximum context length of {max_model_len} tokens",
                name,
            )
    asked = request.max_completion_tokens or request.max_tokens or sampling.max_new_tokens
    return min(asked, sampling.max_new_tokens, max_model_len - prompt_len)


def create_app(backend: GenerationBackend, config: ServerConfig) -> FastAPI:
    """The FastAPI app serving ``backend`` under ``config.served_model_name``."""
    engine: BatchingEngine | DirectEngine
    if isinstance(backend, ContinuousBatchingBackend):
        engine = DirectEngine(backend, config.sampling)
    else:
        engine = BatchingEngine(
            backend, config.sampling, window_s=config.batch_window_s, max_batch_size=config.max_batch_size
        )
    tokenizer = backend.tokenizer

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        yield
        await engine.stop()

    app = FastAPI(title="grpojob generation server", lifespan=lifespan)
    app.add_middleware(StripRolloutPrefix)
    refuse_in_openai_shape(app, 400)
    app.state.engine = engine
    app.state.backend = backend

    def check_model(model: str | None) -> None:
        if model is not None and model != config.served_model_name:
            raise ApiError(404, f"The model `{model}` does not exist; this server serves `{config.served_model_name}`")

    def prompt_ids(messages: list[dict[str, Any]], tools: Any, add_generation_prompt: bool = True) -> list[int]:
        try:
            return build_prompt_token_ids(tokenizer, messages, tools, add_generation_prompt=add_generation_prompt)
        except PromptError as error:
            raise ApiError(400, str(error), "messages") from error

    @app.get("/")
    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "weights_version": backend.weights_version}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": config.served_model_name,
            "object": "model",
            "created": 0,
            "owned_by": "grpojob",
            "max_model_len": backend.max_model_len,
        }
        return {"object": "list", "data": [card]}

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        check_model(body.model)
        if (body.messages is None) == (body.prompt is None):
            raise ApiError(400, "send exactly one of messages or prompt", "messages")
        if body.messages is not None:
            tokens = prompt_ids(body.messages, body.tools, body.add_generation_prompt)
        else:
            tokens = list(tokenizer(body.prompt, add_special_tokens=False)["input_ids"])
        return {"tokens": tokens, "count": len(tokens), "max_model_len": backend.max_model_len}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest) -> dict[str, Any]:
        check_model(body.model)
        sampling, purpose = request_sampling(body, config)
        check_on_policy(body, sampling, purpose)
        prompt = prompt_ids(body.messages, body.tools)
        budget = token_budget(body, len(prompt), sampling, backend.max_model_len)
        result = await engine.generate(GenerationRequest(tuple(prompt), budget), sampling)
        parsed = parse_tool_calls(tokenizer.decode(list(result.token_ids), skip_special_tokens=True))
        finish_reason = result.finish_reason
        if finish_reason == "stop" and parsed.tool_calls:
            finish_reason = "tool_calls"
        tokens = TokenIds(
            prompt_token_ids=prompt,
            generation_token_ids=list(result.token_ids),
            generation_log_probs=list(result.log_probs),
        )
        message = ChatCompletionMessage(
            role="assistant", content=parsed.content, tool_calls=parsed.tool_calls or None, **tokens.model_dump()
        )
        logprobs = None
        if body.logprobs:
            logprobs = ChoiceLogprobs(
                content=[
                    ChatCompletionTokenLogprob(token=f"token_id:{t}", logprob=lp, bytes=None, top_logprobs=[])
                    for t, lp in zip(result.token_ids, result.log_probs, strict=True)
                ]
            )
        completion = ChatCompletion(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            object="chat.completion",
            created=int(time.time()),
            model=config.served_model_name,
            choices=[Choice(index=0, message=message, finish_reason=finish_reason, logprobs=logprobs)],
            usage=CompletionUsage(
                prompt_tokens=len(prompt),
                completion_tokens=len(result.token_ids),
                total_tokens=len(prompt) + len(result.token_ids),
            ),
            weights_version=result.weights_version,
        )
        return completion.model_dump(mode="json", exclude_unset=True)

    return app
