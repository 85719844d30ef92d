"""The job a command runs: its YAML read as `kubectl apply` would, and its datasets read into prompts and rows,
the same for `grpojob run` and the trainer pod."""

from __future__ import annotations

import secrets
from pathlib import Path

import yaml
from pydantic import ValidationError

from grpojob_api import admission, kubeyaml
from grpojob_api import v1alpha1 as api
from grpojob_trainer.errors import UsageError
from grpojob_trainer.nemo_gym.protocol import Row
from grpojob_trainer.training.data import Prompts


def load_job(path: Path) -> api.GRPOJob:
    """Read and validate a GRPOJob YAML file as `kubectl apply` would; errors name the field."""
    try:
        manifest = kubeyaml.load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise UsageError(f"{path}: {error}") from None
    if isinstance(manifest, dict):  # the API server needs both to know what the object is
        missing = [field for field in ("apiVersion", "kind") if not manifest.get(field)]
        if missing:
            wanted = {"apiVersion": api.API_VERSION, "kind": api.KIND}
            raise UsageError(f"{path}: {missing[0]}: required ({missing[0]}: {wanted[missing[0]]})")
    try:
        return admission.parse_job(manifest)
    except ValidationError as error:
        raise UsageError(f"{path}: invalid GRPOJob: {admission.describe(error)}") from None


def read_evaluation_rows(spec: api.GRPOJobSpec, location: str | None) -> list[Row] | None:
    """The held-out rows of ``spec.evaluation`` (its first ``maxRows``) read from ``location`` (a file or a hub
    dataset's snapshot); None without an evaluation. Raises `UsageError` naming the field for rows it cannot
    read."""
    from grpojob_trainer.training.sources import load_rows

    evaluation = spec.evaluation
    if evaluation is None:
        return None
    if location is None:
        raise UsageError("spec.evaluation.dataset: the trainer was given no place to read it from")
    try:
        rows = load_rows(evaluation.dataset, location, "spec.evaluation.dataset")
    except ValueError as error:
        raise UsageError(str(error)) from None
    return rows[: evaluation.max_rows]


def read_training_prompts(spec: api.GRPOJobSpec, locations: list[str]) -> Prompts:
    """The training prompts of ``spec.dataset``, each source read from its place in ``locations``. Raises
    `UsageError` naming the field for rows it cannot read."""
    from grpojob_trainer.training.sources import load_prompts

    try:
        return load_prompts(spec.dataset, locations, spec.grpo.seed)
    except ValueError as error:
        raise UsageError(str(error)) from None


def new_evaluation_token(spec: api.GRPOJobSpec) -> str | None:
    """A fresh secret that marks this run's evaluation requests (none without an evaluation)."""
    return secrets.token_urlsafe(24) if spec.evaluation is not None else None
