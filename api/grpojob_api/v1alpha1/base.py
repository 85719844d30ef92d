"""What every part of the GRPOJob API builds on: the group, version and kind, the limits that keep CEL rules within
the API server's cost budget, the CEL helpers, the base model, and the small types several parts share (a path
inside a volume, a quantity, a claim, a Secret key).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
)
from pydantic.alias_generators import to_camel

from grpojob_api.quantity import parse_quantity

GROUP = "grpo.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "GRPOJob"
PLURAL = "grpojobs"
SINGULAR = "grpojob"
SHORT_NAMES = ("grpo",)

# KubeRay derives pod and Service names from the RayCluster name and caps it at 53 characters; the
# longest child name we derive is `<job>-env-<environment>` (a Service: a DNS-1035 label, 63 max).
MAX_JOB_NAME_LENGTH = 40
MAX_ENVIRONMENT_NAME_LENGTH = 18
DNS_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"

# Longest path inside a volume (Linux's PATH_MAX); strings and lists that CEL rules read are bounded so
# the API server's cost estimate of the rules stays within its budget.
MAX_PATH_LENGTH = 4096
MAX_ENV_VARS = 128
# Longest duration in seconds: an int32, as Kubernetes' own (a Job's ttlSecondsAfterFinished, a Deployment's
# progressDeadlineSeconds), about 68 years; the operator adds these to timestamps.
MAX_SECONDS = 2**31 - 1

LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
"""A label value, as the API server takes it: at most 63 letters, digits, `-`, `_` and `.`, starting and ending with
a letter or digit (or empty)."""
MAX_LABEL_VALUE_LENGTH = 63
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def label_problem(key: str, value: str | None = None) -> str | None:
    """Why the API server refuses a label (or, without ``value``, an annotation's key), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"key {key!r}: its prefix must be a DNS subdomain (lower case, at most 253 characters)"
    if len(name) > MAX_LABEL_VALUE_LENGTH or not _QUALIFIED_NAME.match(name):
        return (
            f"key {key!r}: its name must be 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a "
            "letter or digit"
        )
    if value is not None and (len(value) > MAX_LABEL_VALUE_LENGTH or not re.match(LABEL_VALUE, value)):
        return (
            f"value {value!r} of {key!r} must be at most 63 letters, digits, '-', '_' or '.', starting and ending "
            "with a letter or digit"
        )
    return None


DnsLabel = Annotated[str, StringConstraints(pattern=DNS_LABEL, min_length=1, max_length=MAX_ENVIRONMENT_NAME_LENGTH)]


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One CEL rule of the CRD (an `x-kubernetes-validations` entry): the API server's copy of a validator
    beside it. ``message`` says what is wrong as the validator does; ``field_path`` (relative, `.name`)
    is the field the API server names, the object the rule sits on by default."""
    return {"rule": rule, "message": message} | ({"fieldPath": field_path} if field_path else {})


def given(*fields: str) -> str:
    """A CEL guard: the rule holds where one of ``fields`` is absent. Defaults fill them in every object
    the API server validates, but it also checks the rule on the section's own default, `{}`."""
    return "".join(f"!has(self.{f}) || " for f in fields)


def cel_rules(*rules: dict[str, str]) -> dict[str, Any]:
    """Schema extras carrying CEL rules, for `Field(json_schema_extra=...)` or a model's config."""
    return {"x-kubernetes-validations": list(rules)}


class ApiModel(BaseModel):
    """Base of every API object: camelCase aliases, unknown fields refused, docstrings as descriptions."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=True,
    )


def stays_inside(where: str) -> tuple[dict[str, Any], AfterValidator]:
    """The CEL rule and the validator refusing a path with a `..` segment, which would leave ``where``."""
    message = f"must not contain `..` (a path inside {where})"

    def check(path: str) -> str:
        if ".." in path.split("/"):
            raise ValueError(f"{path!r} {message}")
        return path

    return cel_rules(cel("!self.matches('(^|/)[.][.](/|$)')", message)), AfterValidator(check)


_IN_VOLUME_RULE, _IN_VOLUME = stays_inside("the volume")
VolumePath = Annotated[str, Field(max_length=MAX_PATH_LENGTH, json_schema_extra=_IN_VOLUME_RULE), _IN_VOLUME]
"""A path inside a volume: no `..` segment, so it cannot leave the volume."""


def _non_negative_quantity(text: str) -> str:
    if parse_quantity(text) < 0:
        raise ValueError(f"{text!r} must not be negative")
    return text


Quantity = Annotated[
    str,
    Field(
        max_length=64,
        json_schema_extra=cel_rules(
            cel(
                # Kubernetes parses a missing number (`Ki`, `.`, `e3`) as 0; the grammar, and we, want one. A sign
                # is the grammar's too: `-0` is 0, which a container's resources take, as we do.
                "isQuantity(self) && self.matches('^[+-]?([0-9]|[.][0-9])') && "
                "quantity(self).compareTo(quantity('0')) >= 0",
                "must be a non-negative Kubernetes quantity such as 500m, 2Gi, 1e3 or .5",
            )
        ),
    ),
    AfterValidator(_non_negative_quantity),
]
"""A Kubernetes quantity (`500m`, `2Gi`, `1e3`, `.5`), by Kubernetes' grammar."""


def _positive_quantity(text: str) -> str:
    if parse_quantity(text) <= 0:
        raise ValueError(f"{text!r} must be greater than zero")
    return text


PositiveQuantity = Annotated[
    str,
    Field(
        max_length=64,
        json_schema_extra=cel_rules(
            cel(
                "isQuantity(self) && self.matches('^[+-]?([0-9]|[.][0-9])') && "
                "quantity(self).compareTo(quantity('0')) > 0",
                "must be a Kubernetes quantity greater than zero, such as 64Gi or 1e12",
            )
        ),
    ),
    AfterValidator(_positive_quantity),
]
"""A quantity greater than zero: what the API server takes as a claim's storage request."""


class PvcSource(ApiModel):
    """A path inside a PersistentVolumeClaim, mounted read-only where it is needed."""

    claim_name: str = Field(min_length=1)
    """Name of the PersistentVolumeClaim in the GRPOJob's namespace."""
    path: VolumePath = Field(default="", pattern=r"^[^/]|^$")
    """Path inside the volume (relative, without `..`; empty for its root)."""


class SecretKeyRef(ApiModel):
    name: str = Field(min_length=1)
    key: str = Field(min_length=1)
