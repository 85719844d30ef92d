"""The CRD is generated from the pydantic models, and the committed copy never drifts from them."""

from __future__ import annotations

from pathlib import Path

import yaml

from grpojob_api import crd

COMMITTED = Path(__file__).resolve().parents[3] / "charts" / "grpojob" / "crds" / "grpo.dev_grpojobs.yaml"


def test_committed_crd_matches_the_models():
    assert COMMITTED.read_text() == crd.render(), "run: python -m grpojob_api.crd > " + str(COMMITTED)


def _walk(schema: dict, path: str = ""):
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural():
    root = yaml.safe_load(COMMITTED.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(root):
        assert not {"$ref", "anyOf", "oneOf", "allOf", "title", "$defs"} & set(node), path
        if path not in (".metadata",) and not node.get("x-kubernetes-preserve-unknown-fields"):
            assert "type" in node, f"{path} has no type"


def test_defaults_apply_to_omitted_sections():
    root = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = root["properties"]["spec"]["properties"]
    assert spec["grpo"]["default"] == {}
    assert spec["grpo"]["properties"]["clipHigh"]["default"] == 0.28
    assert spec["generation"]["properties"]["temperature"]["default"] == 1.0
    assert spec["generation"]["properties"]["topP"]["exclusiveMinimum"] is True


def test_printer_columns_show_progress_and_placement():
    version = crd.crd()["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Phase",
        "Step",
        "Reward",
        "Eval",
        "Attempt",
        "Placement",
        "Age",
    ]
    evaluation = next(c for c in version["additionalPrinterColumns"] if c["name"] == "Eval")
    assert evaluation["jsonPath"] == ".status.lastEvaluation.meanReward", "the newest evaluation's mean reward"
    assert version["subresources"] == {"status": {}}
