"""Judge a GRPOJob manifest as the API server admits it, so `grpojob run` and `kubectl apply` agree, and
say what is wrong with one in the manifest's terms.

Before the CRD's schema and CEL rules (mirrored by the models' fields and validators), the API server
decodes JSON numbers (integers within int64; a whole-number float counts as an integer) and drops
every null of a field its schema does not declare `nullable`, then applies defaults. `parse_job` does the
same on the generated CRD's schema and validates strictly: `"3"` is not 3, `"yes"` or 1 not true; a test
holds the two verdicts equal on fuzzed manifests.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from pydantic import ValidationError

from grpojob_api import crd
from grpojob_api import v1alpha1 as api

INT64 = (-(2**63), 2**63 - 1)
WHOLE_FLOATS = 2**53  # a whole-number float up to this size is an integer to JSON Schema


@functools.cache
def job_schema() -> dict[str, Any]:
    """The CRD's structural schema of a whole GRPOJob."""
    return crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def as_decoded(value: Any, schema: dict[str, Any] | None) -> Any:
    """``value`` as the API server holds it before defaulting: numbers as it decodes them, nulls of
    fields that are not nullable (in ``schema``, a structural schema) dropped."""
    if isinstance(value, dict):
        decoded = {}
        for key, item in value.items():
            child = _child(schema, key)
            if item is None and child is not None and not child.get("nullable"):
                continue
            decoded[key] = as_decoded(item, child)
        return decoded
    if isinstance(value, list):
        items = schema.get("items") if schema else None
        return [as_decoded(item, items) for item in value]
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
        return float(value)
    if isinstance(value, float) and value.is_integer() and abs(value) <= WHOLE_FLOATS:
        return int(value)
    return value


def _child(schema: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    if schema is None:
        return None
    if key in schema.get("properties", {}):
        return schema["properties"][key]
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def parse_job(manifest: Any) -> api.GRPOJob:
    """Validate a GRPOJob manifest as the API server admits it (for `grpojob run`, the trainer and the
    operator alike): strict types, integers within int64, nulls of fields that are not nullable taken as
    absent. Raises pydantic's ValidationError, naming the fields (`describe` words it)."""
    text = json.dumps(as_decoded(manifest, job_schema()), default=str)
    return api.GRPOJob.model_validate_json(text, strict=True)


def field_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location (by alias) as a Kubernetes field path: ("spec", "environments", 0,
    "port") → `spec.environments[0].port`."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else ("." if path else "") + str(part)
    return path


def describe(error: ValidationError) -> str:
    """A validation error as `field: problem` parts, fields named as in the manifest."""
    parts = []
    for item in error.errors():
        message = item["msg"].removeprefix("Value error, ")
        parts.append(message if message.startswith("spec.") else f"{field_path(tuple(item['loc']))}: {message}")
    return "; ".join(parts)
