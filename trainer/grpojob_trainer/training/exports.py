"""The models a run exports to its output (`spec.output`): the policy as it stands (the final model, and each
checkpoint's with ``spec.output.everyCheckpoint``), or a checkpoint's (the best evaluation's), each reported to
the job's progress by its path inside the output claim."""

from __future__ import annotations

import logging
from pathlib import Path

from grpojob_api import paths
from grpojob_api import v1alpha1 as api
from grpojob_trainer.observability.metrics import ProgressPublisher
from grpojob_trainer.policy.checkpoint import checkpoint_path
from grpojob_trainer.policy.group import PolicyGroup

log = logging.getLogger(__name__)


def export_checkpoint_model(
    job: api.GRPOJob,
    policy: PolicyGroup,
    checkpoint_dir: Path,
    output_dir: Path,
    step: int,
    progress: ProgressPublisher,
) -> None:
    """Export the model of the checkpoint of ``step`` (`spec.output.select: bestEvaluation`) as the final one."""
    output = job.spec.output
    checkpoint = checkpoint_path(checkpoint_dir, step)
    final = output_dir / paths.FINAL_MODEL_DIR
    written = policy.export_checkpoint(str(checkpoint), str(final), output.dtype, output.format)
    log.info("exported the model of step %d (the best evaluation) from %s to %s", step, checkpoint, written)
    progress.publish_output_model(f"{paths.output_dir(job)}/{paths.FINAL_MODEL_DIR}", step)


def export_model(
    job: api.GRPOJob, policy: PolicyGroup, output_dir: Path, name: str, step: int, progress: ProgressPublisher
) -> None:
    """Export the policy to ``output_dir / name`` and report it (by its path inside the output claim)."""
    output = job.spec.output
    written = policy.export(str(output_dir / name), output.dtype, job.spec.checkpointing.keep, output.format)
    log.info("exported the model of step %d to %s", step, written)
    progress.publish_output_model(f"{paths.output_dir(job)}/{name}", step)
