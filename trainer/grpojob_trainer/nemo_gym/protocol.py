"""NeMo Gym's models: the row, which is also the body of ``/run`` (strict ``responses_create_params``,
``agent_ref``, task fields), ``/run``'s result (the row echoed, the episode, its reward), and the token
ids of a model call. The environment servers answer with these and the rollout client reads with them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

AGENT_REF_TYPE = "responses_api_agents"


class ResponsesCreateParams(BaseModel):
    """The Responses-API request of a row. Unknown keys are refused (FastAPI answers 422), as in Gym."""

    model_config = ConfigDict(extra="forbid")

    input: str | list[dict[str, Any]]
    """A user message as a string, or Responses input items (messages, function calls and outputs)."""
    tools: list[dict[str, Any]] | None = None
    """Function tools: ``{"type": "function", "name", "description", "parameters", "strict"}``."""
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    instructions: str | None = None
    reasoning: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    model: str | None = None
    text: dict[str, Any] | None = None
    top_logprobs: int | None = None
    truncation: str | None = None
    user: str | None = None
    store: bool | None = None
    service_tier: str | None = None
    include: list[str] | None = None
    background: bool | None = None
    max_tool_calls: int | None = None
    previous_response_id: str | None = None
    prompt: dict[str, Any] | None = None
    stream: Literal[False] | None = None


class AgentRef(BaseModel):
    """Which agent serves a row: ``name`` is the environment name."""

    type: Literal["responses_api_agents"] = AGENT_REF_TYPE
    name: str


class Row(BaseModel):
    """A dataset row, also the body of ``/run``, ``/seed_session`` and ``/verify``: task fields pass through."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: ResponsesCreateParams
    agent_ref: AgentRef | None = None

    def task_fields(self) -> dict[str, Any]:
        """Every field other than ``responses_create_params`` (agent_ref, task and runtime keys)."""
        return self.model_dump(exclude={"responses_create_params"}, exclude_none=True)


class EpisodeResponse(BaseModel):
    """One episode as a Responses object: every output item of every model call and tool call. The
    trainer reads ``output`` (the token ids on it) and whether the last call was cut short; the other
    fields describe the episode and pass through."""

    model_config = ConfigDict(extra="allow")

    id: str | None = None
    object: str = "response"
    created_at: int | None = None
    model: str | None = None
    output: list[dict[str, Any]]
    status: str | None = None
    """``completed``, or ``incomplete`` when the last model call stopped at the token limit."""
    incomplete_details: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None

    @property
    def truncated(self) -> bool:
        """The episode's last model call stopped at the token limit."""
        return self.status == "incomplete" or bool((self.incomplete_details or {}).get("reason"))


class VerifyRequest(Row):
    """``/verify``'s body: the row plus the whole episode."""

    response: EpisodeResponse


class RunResult(BaseModel):
    """``/run``'s answer, which is ``/verify``'s: the row echoed back (task fields included), the episode
    and its reward. Only ``response`` and ``reward`` are required, so that any NeMo Gym agent's result
    reads; everything else passes through."""

    model_config = ConfigDict(extra="allow")

    response: EpisodeResponse
    reward: Annotated[float, Field(strict=True, allow_inf_nan=False)]
    """A finite number (a JSON integer is fine, a boolean or a string is not)."""
    reward_components: dict[str, float] | None = None
    """The parts of a multi-part reward; ``reward`` is their sum."""


def make_row(env_name: str, user_text: str, *, tools: list[dict[str, Any]] | None = None, **task: Any) -> dict:
    """A JSONL row in NeMo Gym's format routed to the agent ``env_name``."""
    params: dict[str, Any] = {"input": [{"role": "user", "content": user_text, "type": "message"}]}
    if tools:
        params["tools"] = tools
    return {"responses_create_params": params, "agent_ref": {"type": AGENT_REF_TYPE, "name": env_name}, **task}


def describe(error: ValidationError) -> str:
    """A validation error in one line: ``field.path: message`` for each problem."""
    return "; ".join(
        ".".join(str(part) for part in e["loc"]) + f": {e['msg']}" if e["loc"] else e["msg"] for e in error.errors()
    )


class TokenIdsError(ValueError):
    """A message or output item carries some token-id fields but not all, or malformed ones."""


class TokenIds(BaseModel):
    """The tokens of one model call, as NeMo Gym carries them: on ``choices[0].message`` of a chat
    completion, flat on the last Responses output item of the call, and on the assistant message sent
    back the next turn (so the generation server reuses them verbatim). All three fields or none; the
    generated ids and their log-probs are equally long."""

    model_config = ConfigDict(frozen=True)

    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]

    @model_validator(mode="after")
    def _aligned(self) -> TokenIds:
        if len(self.generation_token_ids) != len(self.generation_log_probs):
            raise ValueError(
                f"generation_token_ids ({len(self.generation_token_ids)}) and generation_log_probs "
                f"({len(self.generation_log_probs)}) differ in length"
            )
        return self

    @classmethod
    def carried_by(cls, carrier: Mapping[str, Any]) -> TokenIds | None:
        """The token ids a message or output item carries (None when it carries none); raises
        `TokenIdsError` when it carries only some of the fields, or malformed ones."""
        present = [name for name in TOKEN_FIELDS if carrier.get(name) is not None]
        if not present:
            return None
        if len(present) != len(TOKEN_FIELDS):
            missing = [name for name in TOKEN_FIELDS if name not in present]
            raise TokenIdsError(f"carries {present} but not {missing}: send all three or none")
        try:
            return cls.model_validate({name: carrier[name] for name in TOKEN_FIELDS})
        except ValidationError as error:
            raise TokenIdsError(describe(error)) from None


TOKEN_FIELDS = tuple(TokenIds.model_fields)
"""The names of the fields, in NeMo Gym's order."""
