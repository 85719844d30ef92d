"""NeMo Gym's models: the row (strict ``responses_create_params``, ``agent_ref``, task fields) and the
token ids of a model call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

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


class VerifyRequest(Row):
    """``/verify``'s body: the row plus the whole episode as a Responses object."""

    response: dict[str, Any]


def make_row(env_name: str, user_text: str, *, tools: list[dict[str, Any]] | None = None, **task: Any) -> dict:
    """A JSONL row in NeMo Gym's format routed to the agent ``env_name``."""
    params: dict[str, Any] = {"input": [{"role": "user", "content": user_text, "type": "message"}]}
    if tools:
        params["tools"] = tools
    return {"responses_create_params": params, "agent_ref": {"type": AGENT_REF_TYPE, "name": env_name}, **task}


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
            problems = "; ".join(
                ".".join(str(part) for part in e["loc"]) + f": {e['msg']}" if e["loc"] else e["msg"]
                for e in error.errors()
            )
            raise TokenIdsError(problems) from None


TOKEN_FIELDS = tuple(TokenIds.model_fields)
"""The names of the fields, in NeMo Gym's order."""
