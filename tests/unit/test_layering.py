"""`make lint`'s import contracts (pyproject's [tool.importlinter]) hold, and break on a violating import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {
    "api": "grpojob_api",
    "operator": "grpojob_operator",
    "trainer": "grpojob_trainer",
    "testing": "grpojob_testing",
}
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
TRAINER_LAYERS = "The trainer's folders are layers"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the packages and pyproject.toml, to inject imports into."""
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    for folder, package in PACKAGES.items():
        shutil.copytree(REPO / folder / package, tmp_path / folder / package)
    return tmp_path


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(str(tree / folder) for folder in PACKAGES)
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-logo", "--no-cache"],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": path, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_tree_keeps_every_contract(tree: Path):
    result = lint_imports(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        (
            "trainer/grpojob_trainer/training/loop.py",
            "import grpojob_operator.names",
            "The trainer never imports the operator",
        ),
        ("operator/grpojob_operator/handlers.py", "import torch", "The operator imports no trainer, ML or HTTP-server"),
        (
            "operator/grpojob_operator/plan/trainer.py",
            "from grpojob_operator import kube",
            "Manifest builders and the plan",
        ),
        (
            "operator/grpojob_operator/plan/model.py",
            "from grpojob_operator import config_cache",
            "Manifest builders and the plan",
        ),
        ("operator/grpojob_operator/names.py", "import kubernetes", "Manifest builders and the plan"),
        (
            "operator/grpojob_operator/plan/actions.py",
            "from grpojob_operator.plan import trainer",
            "The plan's stages build",
        ),
        (
            "operator/grpojob_operator/plan/model.py",
            "from grpojob_operator.plan import trainer",
            "The plan's stages build",
        ),
        (
            "operator/grpojob_operator/children/trainer.py",
            "from grpojob_operator.plan import conditions",
            "The operator imports downwards",
        ),
        ("operator/grpojob_operator/kueue.py", "from grpojob_operator import plan", "The operator imports downwards"),
        ("trainer/grpojob_trainer/algorithm/samples.py", "import ray", "The GRPO math imports no Ray, HTTP"),
        ("trainer/grpojob_trainer/policy/group.py", "from grpojob_trainer.training import loop", TRAINER_LAYERS),
        ("trainer/grpojob_trainer/generation/app.py", "from grpojob_trainer.policy import learner", TRAINER_LAYERS),
        ("trainer/grpojob_trainer/weight_sync/buckets.py", "from grpojob_trainer.policy import ranks", TRAINER_LAYERS),
        ("trainer/grpojob_trainer/weight_sync/paths.py", "from grpojob_trainer.policy import group", TRAINER_LAYERS),
        ("trainer/grpojob_trainer/algorithm/grpo.py", "from grpojob_trainer.nemo_gym import protocol", TRAINER_LAYERS),
        ("trainer/grpojob_trainer/algorithm/samples.py", "from grpojob_trainer.training import loop", TRAINER_LAYERS),
        (
            "trainer/grpojob_trainer/nemo_gym/protocol.py",
            "from grpojob_trainer.experience import conversion",
            TRAINER_LAYERS,
        ),
        ("trainer/grpojob_trainer/experience/rollouts.py", "from grpojob_trainer.training import loop", TRAINER_LAYERS),
        ("trainer/grpojob_trainer/net/http.py", "from grpojob_trainer.nemo_gym import protocol", TRAINER_LAYERS),
        ("trainer/grpojob_trainer/cluster/connection.py", "from grpojob_trainer.local import reaper", TRAINER_LAYERS),
        ("trainer/grpojob_trainer/policy/worker.py", "from grpojob_trainer.generation import worker", TRAINER_LAYERS),
        ("trainer/grpojob_trainer/training/loop.py", "from grpojob_trainer.commands import job", TRAINER_LAYERS),
        ("trainer/grpojob_trainer/commands/job.py", "from grpojob_trainer.commands import local", "The commands share"),
        ("trainer/grpojob_trainer/nemo_gym/protocol.py", "import torch", "NeMo Gym's protocol and the environment"),
        ("trainer/grpojob_trainer/environments/base.py", "import ray", "NeMo Gym's protocol and the environment"),
        (
            "trainer/grpojob_trainer/observability/metrics.py",
            "from grpojob_trainer.nemo_gym import protocol",
            "Observability imports none of the trainer's other packages",
        ),
        (
            "trainer/grpojob_trainer/cli.py",
            "from grpojob_testing import cluster",
            "Product code never imports the test",
        ),
        ("api/grpojob_api/progress.py", "import grpojob_trainer", "The API package imports none of ours"),
        ("api/grpojob_api/v1alpha1/job.py", "from grpojob_api import admission", "The API's types import only the"),
        ("api/grpojob_api/v1alpha1/base.py", "from grpojob_api import paths", "The API's types import only the"),
        ("api/grpojob_api/v1alpha1/base.py", "from grpojob_api.v1alpha1 import job", "The API's parts of the spec"),
        (
            "api/grpojob_api/v1alpha1/training.py",
            "from grpojob_api.v1alpha1 import generation",
            "The API's parts of the spec",
        ),
        ("api/grpojob_api/v1alpha1/generation.py", "from grpojob_api.v1alpha1 import status", "The API's parts"),
        ("api/grpojob_api/quantity.py", "from grpojob_api import v1alpha1", "The API's types import only the"),
        ("api/grpojob_api/crd.py", "from grpojob_api import admission", "The API's types import only the"),
    ],
)
def test_an_import_across_a_layer_breaks_its_contract(tree: Path, module: str, line: str, contract: str):
    source = tree / module
    source.write_text(source.read_text() + f"\n\ndef _violation() -> None:\n    {line}  # noqa\n")

    result = lint_imports(tree)

    assert result.returncode != 0
    broken = [text for text in result.stdout.splitlines() if text.endswith("BROKEN")]
    assert any(text.startswith(contract) for text in broken), result.stdout


def test_a_new_api_module_must_take_its_place_in_the_layers(tree: Path):
    (tree / "api" / "grpojob_api" / "naming.py").write_text('"""Not in the API\'s layers yet."""\n')

    result = lint_imports(tree)

    assert result.returncode != 0
    assert "grpojob_api.naming" in result.stdout, result.stdout


def test_a_new_trainer_folder_must_take_its_place_in_the_layers(tree: Path):
    folder = tree / "trainer" / "grpojob_trainer" / "scheduling"
    folder.mkdir()
    (folder / "__init__.py").write_text('"""Not in the trainer\'s layers yet."""\n')

    result = lint_imports(tree)

    assert result.returncode != 0
    assert "grpojob_trainer.scheduling" in result.stdout, result.stdout
