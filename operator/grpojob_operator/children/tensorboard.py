"""TensorBoard over the job's log directory (`spec.logging.tensorboard`): a Deployment and its Service."""

from __future__ import annotations

from grpojob_api import endpoints
from grpojob_api import v1alpha1 as api
from grpojob_operator import names
from grpojob_operator.children import claims, pod
from grpojob_operator.children.meta import Manifest, job_ref, labels, metadata
from grpojob_operator.settings import OperatorSettings


def _tensorboard_selector(job: api.GRPOJob) -> dict[str, str]:
    job_name, _ = job_ref(job)
    return {names.JOB_LABEL: job_name, names.COMPONENT_LABEL: "tensorboard"}


def build_tensorboard_deployment(job: api.GRPOJob, settings: OperatorSettings) -> Manifest:
    """TensorBoard over the job's log directory (every attempt's run), on the log claim mounted read-only,
    from the trainer image (which has TensorBoard). Placed as the trainer is (`spec.scheduling.trainer`): the
    job's other CPU pod."""
    job_name, _ = job_ref(job)
    logs = claims.log_mount(job, read_only=True)
    selector = _tensorboard_selector(job)
    port = endpoints.TENSORBOARD_PORT
    container = pod.container(
        "tensorboard",
        job.spec.images.trainer or settings.default_trainer_image(),
        command=["tensorboard", f"--logdir={logs.path}", "--host=0.0.0.0", f"--port={port}"],
        ports=[{"name": "http", "containerPort": port}],
        readinessProbe={"httpGet": {"path": "/", "port": port}, "periodSeconds": 5},
        resources={"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        volumeMounts=[*logs.mounts, {"name": "tmp", "mountPath": "/tmp"}],
    )
    template = pod.hardened_pod(
        {**labels(job, "tensorboard"), **selector},
        [container],
        [*logs.volumes, {"name": "tmp", "emptyDir": {}}],
        job.spec.scheduling.trainer,
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(job, names.ChildNames(job_name).tensorboard, "tensorboard"),
        "spec": {"replicas": 1, "selector": {"matchLabels": selector}, "template": template},
    }


def build_tensorboard_service(job: api.GRPOJob) -> Manifest:
    """`<job>-tensorboard`: `kubectl port-forward svc/<job>-tensorboard 6006`."""
    job_name, _ = job_ref(job)
    port = endpoints.TENSORBOARD_PORT
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(job, names.ChildNames(job_name).tensorboard, "tensorboard"),
        "spec": {
            "selector": _tensorboard_selector(job),
            "ports": [{"name": "http", "port": port, "targetPort": port}],
        },
    }
