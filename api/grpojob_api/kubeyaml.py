"""YAML read (and written) as `kubectl` reads it, so `grpojob run` sees the values `kubectl apply` sends.

kubectl converts YAML to JSON with sigs.k8s.io/yaml (go-yaml v2 rules); PyYAML follows YAML 1.1. They
differ on plain scalars: kubectl reads `1e2` as a number, `y`/`n` as booleans and `0o17` as an
integer; it keeps `12:30` and `2024-01-01` as strings and refuses `.inf` and `.nan` (JSON has neither).
Go's JSON writes a whole float below 1e21 without a fraction or an exponent (`1e17` as
`100000000000000000`), which the API server then reads as an integer, so `load` reads such a float as an
integer too.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import yaml

_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"


class KubectlLoader(yaml.SafeLoader):
    """PyYAML's safe loader with go-yaml v2's plain-scalar rules (strings that are not JSON stay strings)."""

    bool_values: ClassVar[dict[str, bool]] = {**yaml.SafeLoader.bool_values, "y": True, "n": False}


KubectlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL, _INT, _FLOAT, _TIMESTAMP)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
KubectlLoader.add_implicit_resolver(
    _BOOL,
    re.compile(r"^(?:y|Y|yes|Yes|YES|true|True|TRUE|on|On|ON|n|N|no|No|NO|false|False|FALSE|off|Off|OFF)$"),
    list("yYnNtTfFoO"),
)
KubectlLoader.add_implicit_resolver(
    _INT, re.compile(r"^[-+]?(?:0b[01_]+|0o[0-7_]+|0x[0-9a-fA-F_]+|0[0-7_]*|[1-9][0-9_]*)$"), list("-+0123456789")
)
KubectlLoader.add_implicit_resolver(
    _FLOAT, re.compile(r"^[-+]?(?:\.[0-9_]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?$"), list("-+.0123456789")
)


GO_JSON_PLAIN_FLOATS = 1e21
"""Go's `encoding/json` writes a float64 of smaller magnitude without an exponent."""


def _float_as_kubectl_sends(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float | int:
    value = loader.construct_yaml_float(node)
    return int(value) if value.is_integer() and abs(value) < GO_JSON_PLAIN_FLOATS else value


KubectlLoader.add_constructor(_FLOAT, _float_as_kubectl_sends)


class KubectlDumper(yaml.SafeDumper):
    """PyYAML's safe dumper that quotes every string kubectl would read as something else (`'y'`, `'1e9'`)."""


KubectlDumper.yaml_implicit_resolvers = KubectlLoader.yaml_implicit_resolvers


def dump(document: Any) -> str:
    """``document`` as YAML that kubectl and `load` read back unchanged."""
    return yaml.dump(document, Dumper=KubectlDumper, sort_keys=False)


def load(text: str) -> Any:
    """The document in ``text`` as kubectl would send it (yaml.YAMLError when it is not YAML)."""
    return yaml.load(text, Loader=KubectlLoader)
