"""The code stays in rooms a reader can take in at once (issue 24): no API, operator or trainer module over 500 lines,
and the trainer's top level holds its subpackages and its entry modules only."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 500
TRAINER_ENTRY_MODULES = {"__init__.py", "cli.py", "errors.py"}


@pytest.mark.parametrize("package", ["api/grpojob_api", "operator/grpojob_operator", "trainer/grpojob_trainer"])
def test_no_module_is_over_500_lines(package: str):
    sizes = {path: len(path.read_text().splitlines()) for path in (REPO / package).rglob("*.py")}

    too_long = {str(path.relative_to(REPO)): lines for path, lines in sizes.items() if lines > MAX_LINES}

    assert sizes and not too_long


def test_the_trainers_top_level_holds_subpackages_and_its_entry_modules():
    top = REPO / "trainer" / "grpojob_trainer"

    modules = {path.name for path in top.glob("*.py")}

    assert modules == TRAINER_ENTRY_MODULES
    assert {
        "algorithm",
        "commands",
        "training",
        "experience",
        "policy",
        "weight_sync",
        "generation",
        "cluster",
        "local",
        "net",
        "observability",
    } <= {path.name for path in top.iterdir() if (path / "__init__.py").exists()}
