"""Where a GRPOJob's files go: its checkpoint, output and log directories (relative to their claim, or to
the working directory of `grpojob run`), the exported models' names, and a Hugging Face hub snapshot."""

from __future__ import annotations

from grpojob_api import v1alpha1 as api

FINAL_MODEL_DIR = "final"
"""The model exported at the end of the job: `<output dir>/final`."""


def checkpoint_dir(job: api.GRPOJob) -> str:
    """The job's checkpoint directory, relative to the claim (or the working directory)."""
    return job.spec.checkpointing.path or f"checkpoints/{job.metadata.name}"


def output_dir(job: api.GRPOJob) -> str:
    """The job's output directory (exported models), relative to the claim (or the working directory)."""
    return job.spec.output.path or f"models/{job.metadata.name}"


def step_model_dir(step: int) -> str:
    """The model exported with the checkpoint of ``step``: `<output dir>/step_<step:08d>`."""
    return f"step_{step:08d}"


def log_dir(job: api.GRPOJob) -> str:
    """The job's log directory, relative to its claim (`GRPOJobSpec.log_claim`): each trainer attempt writes
    `attempt-<n>/` in it."""
    return job.spec.logging.path or f"logs/{job.metadata.name}"


def hub_snapshot_path(repo_id: str, commit: str, repo_type: str = "model") -> str:
    """Where the Hugging Face hub cache holds ``commit`` of ``repo_id``, relative to the cache's root
    (`HF_HUB_CACHE`): `models--<owner>--<name>/snapshots/<commit>`, or `datasets--…` for a dataset (the hub's
    layout)."""
    return f"{repo_type}s--" + repo_id.replace("/", "--") + f"/snapshots/{commit}"
