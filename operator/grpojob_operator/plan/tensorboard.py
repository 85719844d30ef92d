"""Stage: TensorBoard follows `spec.logging.tensorboard`: created when it is true (it needs no address, and
shows each attempt's run as it appears), deleted when it is turned off."""

from __future__ import annotations

from grpojob_operator.children.tensorboard import build_tensorboard_deployment, build_tensorboard_service
from grpojob_operator.plan.actions import Create
from grpojob_operator.plan.cleanup import present, tensorboard_deletions
from grpojob_operator.plan.context import GO_ON, Pass


def tensorboard(pass_: Pass) -> bool:
    """Create or delete the TensorBoard Deployment and Service."""
    job, observed = pass_.job, pass_.observed
    if not job.spec.logging.tensorboard:
        pass_.plan.actions += present(tensorboard_deletions(pass_.child), observed)
        return GO_ON
    # Kueue admits TensorBoard's pod too (pod set `tensorboard`): it goes where its flavor says.
    deployment = pass_.place(build_tensorboard_deployment(job, pass_.settings))
    wanted = [deployment, build_tensorboard_service(job)]
    pass_.plan.actions += [Create(m) for m in wanted if not observed.has(m["kind"], m["metadata"]["name"])]
    return GO_ON
