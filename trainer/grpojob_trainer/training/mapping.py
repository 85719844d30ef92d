"""Plain prompt columns made into NeMo Gym rows (`spec.dataset.mapping`). Pure: records in, rows out.

{"question": "What is 2+3?", "answer": "5"}
    with {promptField: question, systemPrompt: "Answer with digits.", environment: arithmetic,
          fields: {expected_answer: answer}}
→   {"responses_create_params": {"input": [{"role": "system", "content": "Answer with digits.", ...},
                                           {"role": "user", "content": "What is 2+3?", ...}]},
     "agent_ref": {"type": "responses_api_agents", "name": "arithmetic"},
     "expected_answer": "5"}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpojob_api import v1alpha1 as api
from grpojob_trainer.nemo_gym.protocol import AGENT_REF_TYPE


class MappingError(ValueError):
    """A record lacks a column the mapping names, or its prompt is not text."""


def _column(record: Mapping[str, Any], column: str, field: str) -> Any:
    if column not in record:
        raise MappingError(f"{field}: no column {column!r} (the columns are {sorted(record)})")
    return record[column]


def mapped_row(record: Mapping[str, Any], mapping: api.DatasetMapping) -> dict[str, Any]:
    """The NeMo Gym row of ``record``: its prompt (after the system prompt, if any) as the request's input, the
    mapping's environment as `agent_ref.name`, and each of ``mapping.fields`` from its column. Raises
    `MappingError` naming the mapping's field and the missing column."""
    prompt = _column(record, mapping.prompt_field, "promptField")
    if not isinstance(prompt, str) or not prompt:
        raise MappingError(f"promptField: column {mapping.prompt_field!r} holds {prompt!r}, not a prompt's text")
    messages = [{"role": "system", "content": mapping.system_prompt}] if mapping.system_prompt else []
    messages.append({"role": "user", "content": prompt})
    row: dict[str, Any] = {
        "responses_create_params": {"input": [{**message, "type": "message"} for message in messages]},
        "agent_ref": {"type": AGENT_REF_TYPE, "name": mapping.environment},
    }
    for name, column in mapping.fields.items():
        row[name] = _column(record, column, f"fields.{name}")
    return row
