"""The API reference page is generated from the CRD's schema, and the committed page never drifts from it."""

from __future__ import annotations

from pathlib import Path

from grpojob_api import crd, reference

COMMITTED = Path(__file__).resolve().parents[3] / "docs" / "reference" / "api.md"


def test_committed_reference_matches_the_crd():
    assert COMMITTED.read_text() == reference.render(), (
        "docs/reference/api.md is out of date: run `make generate` (python -m grpojob_api.reference > "
        + str(COMMITTED)
        + ")"
    )


def _fields(schema: dict, path: str):
    for name, child in schema.get("properties", {}).items():
        yield f"{path}.{name}", child
        yield from _fields(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _fields(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _fields(schema["additionalProperties"], f"{path}{{}}")


def test_every_field_of_spec_and_status_has_a_row_in_its_objects_section():
    root = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    page = reference.render()
    sections = {section.path for section in reference.sections(root)}
    for top in ("spec", "status"):
        for path, _ in _fields(root["properties"][top], top):
            parent, name = path.rsplit(".", 1)
            assert parent in sections, f"{path}: no section for {parent}"
            section = page.split(f"## `{parent}` ", 1)[1].split("\n## ", 1)[0]
            assert f"\n| `{name}` | " in section, f"{path} has no row"


def test_a_row_says_type_default_limits_and_description():
    page = reference.render()
    rows = {
        line.split(" | ")[0]: line for line in page.split("## `spec.grpo` ", 1)[1].split("\n## ", 1)[0].splitlines()
    }
    max_steps = rows["| `maxSteps`"]
    assert "| integer |" in max_steps
    description = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    expected = " ".join(description["grpo"]["properties"]["maxSteps"]["description"].split())
    assert max_steps.endswith(f"| {expected} |"), "the description kubectl explain shows"
    assert "≥ `1`" in max_steps


def test_pipes_and_angle_brackets_do_not_break_a_table_row():
    text = reference._text("a <job> or `x|y` | b")
    assert text == "a &lt;job&gt; or <code>x&#124;y</code> \\| b"
