"""NeMo Gym's models: the row, which is also the body of ``/run`` (strict ``responses_create_params``,
``agent_ref``, task fields), ``/run``'s result (the row echoed, the episode, its reward), and the token
ids of a model call. The environment servers answer with these and the rollout client reads with them.

Also what every request body our servers take must be (`RequestBody`: valid Unicode) and the text content
of a message (`content_text`), which the generation server's chat messages share."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from grpojob_trainer.errors import problem

AGENT_REF_TYPE = "responses_api_agents"
EVALUATION_MARK = "grpojob_evaluation"
"""The key in a request's ``metadata`` that marks an evaluation rollout's model calls. Its value is the run's
evaluation token, a secret the trainer gives only its generation engines; with it, and only with it, the
generation server samples with the evaluation's parameters instead of refusing them. NeMo Gym passes
``responses_create_params.metadata`` through to the chat completion, as our environments do."""
TEXT_PART_TYPES = ("text", "input_text", "output_text")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def describe(error: ValidationError) -> str:
    """A validation error in one line: ``field.path: message`` for each problem."""
    return "; ".join(problem(e) for e in error.errors())


def lone_surrogate_at(value: Any, loc: tuple[int | str, ...] = ()) -> tuple[int | str, ...] | None:
    """Where in decoded JSON a string (a value or a key) holds a lone surrogate, or None."""
    if isinstance(value, str):
        return loc if LONE_SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and LONE_SURROGATE.search(key):
                return (*loc, key.encode(errors="backslashreplace").decode())  # the key, printable
            if isinstance(item, (str, dict, list)) and (found := lone_surrogate_at(item, (*loc, key))) is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):  # token ids: numbers, skipped without a call each
            if isinstance(item, (str, dict, list)) and (found := lone_surrogate_at(item, (*loc, index))) is not None:
                return found
    return None


class RequestBody(BaseModel):
    """A JSON body our servers take: every string in it must be valid Unicode. JSON lets ``"\\ud800"`` through,
    a lone surrogate that no tokenizer and no JSON answer can encode."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        loc = lone_surrogate_at(data)
        if loc is not None:
            invalid = PydanticCustomError("unicode", "holds a lone surrogate (U+D800 to U+DFFF): not Unicode text")
            raise ValidationError.from_exception_data(
                cls.__name__, [InitErrorDetails(type=invalid, loc=loc, input=data)]
            )
        return data


def content_text(content: Any) -> str | None:
    """A message's ``content`` as plain text: a string, None, or a list of text parts (strings, or objects of
    type ``text``, ``input_text`` or ``output_text`` with a string ``text``). Raises ValueError for anything
    else: our servers take text only."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"must be a string, a list of text parts or null, not {type(content).__name__}")
    texts = []
    for index, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") in TEXT_PART_TYPES and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(part, str):
            texts.append(part)
        else:
            kinds = ", ".join(TEXT_PART_TYPES)
            raise ValueError(f"part {index} is not a text part (of type {kinds}, with a string text): {part!r:.200}")
    return "".join(texts)


def _text_content(content: Any) -> Any:
    content_text(content)
    return content


TextContent = Annotated[str | list[Any] | None, PlainValidator(_text_content)]
"""A message ``content`` that `content_text` reads, kept as sent."""


def shaped_like(model: type[BaseModel]) -> AfterValidator:
    """A validator that checks a JSON object against ``model`` and keeps the object as sent (with the keys
    ``model`` does not name)."""

    def check(value: dict[str, Any]) -> dict[str, Any]:
        model.model_validate(value)
        return value

    return AfterValidator(check)


class Item(BaseModel):
    """A Responses item of a type our conversion knows (a message when it names none)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["message", "function_call", "function_call_output", "reasoning"] = "message"


class MessageItem(Item):
    """A message: its role and text content."""

    role: Literal["user", "assistant", "system", "developer"]
    content: TextContent


class FunctionCallItem(Item):
    """A tool call the model made."""

    call_id: str
    name: str
    arguments: str
    """The call's arguments as a JSON string."""


class FunctionCallOutputItem(Item):
    """What a tool call returned (any JSON; a string is sent as it is)."""

    call_id: str
    output: Any


class SummaryText(BaseModel):
    """One part of a reasoning item's summary."""

    model_config = ConfigDict(extra="allow")

    text: str


class ReasoningItem(Item):
    """The model's reasoning, as summary texts."""

    summary: list[SummaryText] = []


ITEM_MODELS: dict[str, type[Item]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}


def _item(item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type", "message")
    model = ITEM_MODELS.get(kind, Item) if isinstance(kind, str) else Item
    model.model_validate(item)
    return item


ResponsesItem = Annotated[dict[str, Any], AfterValidator(_item)]
"""An input or output item, checked against the model of its type and kept as sent."""
_INPUT_ITEMS = TypeAdapter(list[ResponsesItem])


def _input(value: Any) -> str | list[dict[str, Any]]:
    return value if isinstance(value, str) else _INPUT_ITEMS.validate_python(value)


class FunctionTool(BaseModel):
    """A Responses function tool (the only kind the agent converts for the chat model)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponsesCreateParams(BaseModel):
    """The Responses-API request of a row. Unknown keys are refused (the environment server answers 422), as in
    Gym. Its input items and tools pass as they are: the trainer hands rows to any NeMo Gym agent, whose
    items (images, other tools) are its own business; our environment servers check theirs
    (`CheckedResponsesCreateParams`)."""

    model_config = ConfigDict(extra="forbid")

    input: str | list[dict[str, Any]]
    """A user message as a string, or Responses input items (messages, function calls and outputs)."""
    tools: list[dict[str, Any]] | None = None
    """Tools; our agent converts function tools: ``{"type": "function", "name", "description", "parameters"}``."""
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


class CheckedResponsesCreateParams(ResponsesCreateParams):
    """A row's request as our environment servers run it: input items of the types our conversion knows
    and function tools, each checked against the model of its type and kept as sent."""

    input: Annotated[str | list[dict[str, Any]], PlainValidator(_input)]
    tools: list[Annotated[dict[str, Any], shaped_like(FunctionTool)]] | None = None


class AgentRef(BaseModel):
    """Which agent serves a row: ``name`` is the environment name."""

    type: Literal["responses_api_agents"] = AGENT_REF_TYPE
    name: str


class Row(RequestBody):
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


class VerifiedEpisode(EpisodeResponse):
    """The episode ``/verify`` scores: its output items are checked as input items are."""

    output: list[ResponsesItem]


class EnvironmentRow(Row):
    """The body of our environment servers' ``/run`` and ``/seed_session``: a row whose request they can run."""

    responses_create_params: CheckedResponsesCreateParams


class VerifyRequest(EnvironmentRow):
    """``/verify``'s body: the row plus the whole episode."""

    response: VerifiedEpisode


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
