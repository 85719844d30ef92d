"""Generate the GRPOJob CustomResourceDefinition from the pydantic models.

    python -m grpojob_api.crd > charts/grpojob/crds/grpo.dev_grpojobs.yaml

pydantic writes JSON Schema (draft 2020-12: `$ref`s, `anyOf` with null, numeric exclusive bounds);
Kubernetes wants a structural OpenAPI v3.0 schema (everything inline, `nullable`, boolean exclusive
bounds, no titles). `structural` does that translation, keeping the models' CEL rules
(`x-kubernetes-validations`, see `v1alpha1.cel`); `crd()` adds the rules on metadata or comparing
with the old object, the status subresource and the printer columns.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from grpojob_api import v1alpha1 as api

# Fields that define what is trained; changing them under a running job would silently mix two runs.
IMMUTABLE_WHILE_ACTIVE = (
    "model",
    "dataset",
    "environments",
    "generation",
    "training",
    "placement",
    "grpo",
    "checkpointing",
)
OPTIONAL_FIELDS = ("placement",)
"""Fields of IMMUTABLE_WHILE_ACTIVE without a default: absent stays absent."""
ACTIVE_PHASES = ("Initializing", "Running")

_DROP_KEYS = {"title", "$defs"}


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in schema:
        target = defs[schema["$ref"].rsplit("/", 1)[1]]
        merged = {**_resolve(target, defs), **{k: v for k, v in schema.items() if k != "$ref"}}
        return merged
    return schema


def structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Translate one pydantic JSON Schema node into a structural OpenAPI v3.0 schema node."""
    schema = _resolve(schema, defs)
    out: dict[str, Any] = {}
    variants = schema.get("anyOf")
    if variants is not None:
        non_null = [v for v in variants if v.get("type") != "null"]
        if len(non_null) != 1:
            raise ValueError(f"unions other than Optional[...] cannot be structural: {schema}")
        inner = structural(non_null[0], defs)
        out.update(inner)
        # Null is a value only where the field defaults to something else (see `api.is_nullable`);
        # elsewhere the API server drops a null as an absent field.
        if schema.get("default", ...) is not None:
            out["nullable"] = True
        if schema.get("default") is not None:
            out["default"] = schema["default"]
        if schema.get("description") is not None:  # one line, as every other field's (`kubectl explain` wraps it)
            out["description"] = " ".join(schema["description"].split())
        return out

    optional: set[str] = set()  # fields that may be absent with no default (`X | None = None`)
    for key, value in schema.items():
        if key in _DROP_KEYS or key == "anyOf":
            continue
        if key == "properties":
            out["properties"] = {name: structural(prop, defs) for name, prop in value.items()}
            optional = {name for name, prop in value.items() if "anyOf" in _resolve(prop, defs)}
        elif key == "items":
            out["items"] = structural(value, defs)
        elif key == "additionalProperties":
            out["additionalProperties"] = structural(value, defs) if isinstance(value, dict) else value
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "description":
            out[key] = " ".join(value.split())
        elif key == "const":
            out["enum"] = [value]
        elif key == "format" and value not in ("date-time", "int32", "int64", "double", "float"):
            continue
        else:
            out[key] = value
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if out.get("additionalProperties") is False:
        del out["additionalProperties"]  # structural schemas prune unknown fields already
    if out.get("x-kubernetes-preserve-unknown-fields") and out.get("additionalProperties") is True:
        del out["additionalProperties"]  # free-form: kept as written, not a map of one type
    if out.get("type") == "object" and "properties" in out:
        required = set(out.get("required", []))
        for name, prop in out["properties"].items():
            # Nested defaults only apply inside an object that exists: default absent objects to {}.
            absent_object = prop.get("type") == "object" and name not in required | optional and "default" not in prop
            if absent_object:
                prop["default"] = {}
    return out


def _schema_of(model: type[api.ApiModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return structural(raw, raw.get("$defs", {}))


def _unchanged(field: str) -> str:
    if field in OPTIONAL_FIELDS:
        return (
            f"(has(self.spec.{field}) == has(oldSelf.spec.{field}) && "
            f"(!has(self.spec.{field}) || self.spec.{field} == oldSelf.spec.{field}))"
        )
    return f"self.spec.{field} == oldSelf.spec.{field}"


def _immutability_rules() -> list[dict[str, str]]:
    phases = ", ".join(f"'{p}'" for p in ACTIVE_PHASES)
    return [
        {
            "rule": (
                "!has(oldSelf.status) || !has(oldSelf.status.phase) || "
                f"!(oldSelf.status.phase in [{phases}]) || {_unchanged(field)}"
            ),
            "message": f"spec.{field} is immutable while the job is Initializing or Running (suspend it first)",
            "fieldPath": f".spec.{field}",
        }
        for field in IMMUTABLE_WHILE_ACTIVE
    ]


def crd() -> dict[str, Any]:
    """The complete CustomResourceDefinition object for GRPOJob."""
    spec_schema = _schema_of(api.GRPOJobSpec)
    status_schema = _schema_of(api.GRPOJobStatus)
    root = {
        "type": "object",
        "description": "A GRPO post-training run: a RayCluster, environment servers and a trainer.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
        "x-kubernetes-validations": [
            {
                "rule": f"self.metadata.name.matches('{api.DNS_LABEL}')",
                "message": (
                    "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting with a "
                    "letter): it names the job's Services"
                ),
            },
            {
                "rule": f"size(self.metadata.name) <= {api.MAX_JOB_NAME_LENGTH}",
                "message": (
                    f"metadata.name must be at most {api.MAX_JOB_NAME_LENGTH} characters so the names derived "
                    "from it fit KubeRay's limits"
                ),
            },
            *_immutability_rules(),
        ],
    }
    columns = [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Step", "type": "integer", "jsonPath": ".status.step"},
        {"name": "Reward", "type": "number", "jsonPath": ".status.meanReward", "format": "float"},
        {"name": "Eval", "type": "number", "jsonPath": ".status.lastEvaluation.meanReward", "format": "float"},
        {"name": "Attempt", "type": "integer", "jsonPath": ".status.attempt"},
        {"name": "Placement", "type": "string", "jsonPath": ".status.placement"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{api.PLURAL}.{api.GROUP}"},
        "spec": {
            "group": api.GROUP,
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": list(api.SHORT_NAMES),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def render() -> str:
    """The CRD as the YAML committed under charts/grpojob/crds/."""
    header = "# Generated by `python -m grpojob_api.crd` from grpojob_api/v1alpha1/. Do not edit.\n"
    return header + yaml.dump(crd(), Dumper=_Dumper, sort_keys=False, width=120)


if __name__ == "__main__":
    sys.stdout.write(render())
