"""What a job names by Hugging Face id (its model, `spec.model.id`, and its datasets): the cache claim the job
creates when `spec.model.cache` names none, and the one Job that downloads all of them into the cache, before
any pod that reads them starts."""

from __future__ import annotations

from grpojob_api import endpoints, hub
from grpojob_api import v1alpha1 as api
from grpojob_operator import names
from grpojob_operator.children import pod
from grpojob_operator.children.claims import HUB_CACHE_MOUNT, model_cache_claim
from grpojob_operator.children.meta import Manifest, job_ref, labels, metadata
from grpojob_operator.settings import OperatorSettings

TERMINATION_LOG = "/dev/termination-log"


def build_model_cache_claim(job: api.GRPOJob) -> Manifest:
    """The Hugging Face cache the job creates when `spec.model.cache` names no claim (deleted with the job)."""
    job_name, _ = job_ref(job)
    cache = job.spec.model.cache or api.ModelCacheSpec()
    spec: Manifest = {"accessModes": [cache.access_mode], "resources": {"requests": {"storage": cache.size}}}
    if cache.storage_class_name:
        spec["storageClassName"] = cache.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(job, names.ChildNames(job_name).model_cache, "model-cache"),
        "spec": spec,
    }


def build_model_download_job(job: api.GRPOJob, settings: OperatorSettings) -> Manifest:
    """The Job that downloads what the job names by id (`grpojob_api.hub.hub_repos`: the model and the datasets)
    into the cache claim once, before any pod that reads them starts (`grpojob download`, one argument per
    repository): it reports the commit each resolved, or why it failed, in its termination message, which
    the operator reads. Never retried: an unknown id or a missing token does not heal. Placed as the trainer
    is (`spec.scheduling.trainer`: a CPU pod of the trainer's image)."""
    job_name, _ = job_ref(job)
    repos = hub.hub_repos(job)
    command = ["grpojob", "download", "--cache", HUB_CACHE_MOUNT, "--termination-log", TERMINATION_LOG]
    command += [repo.argument() for repo in repos]
    env: list[Manifest] = [
        {"name": "HOME", "value": "/tmp"},
        {"name": endpoints.HF_HUB_CACHE, "value": HUB_CACHE_MOUNT},
    ]
    if all(repo.offline for repo in repos):
        env.append({"name": endpoints.HF_HUB_OFFLINE, "value": "1"})
    for name, secret in hub.token_secrets(job).items():
        env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}}})
    download = pod.container(
        "download",
        job.spec.images.trainer or settings.default_trainer_image(),
        command=command,
        env=env,
        resources={"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
        volumeMounts=[{"name": "cache", "mountPath": HUB_CACHE_MOUNT}, {"name": "tmp", "mountPath": "/tmp"}],
    )
    volumes = [
        {"name": "cache", "persistentVolumeClaim": {"claimName": model_cache_claim(job)}},
        {"name": "tmp", "emptyDir": {}},
    ]
    template = pod.hardened_pod(
        labels(job, "model-download"), [download], volumes, job.spec.scheduling.trainer, run_once=True
    )
    return pod.run_once_job(metadata(job, names.ChildNames(job_name).model_download, "model-download"), template)
