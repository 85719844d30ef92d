"""The job's claims as its pods mount them: the model (or the job's Hugging Face cache), the datasets, the
checkpoints, the exported model (output) and the logs. Each comes from one helper, `mount_claim`, and each pod
that mounts several passes them through `share_claims`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from grpojob_api import endpoints, hub, paths
from grpojob_api import v1alpha1 as api
from grpojob_operator import names
from grpojob_operator.children.meta import Manifest

MODEL_MOUNT = "/data/model"
HUB_CACHE_MOUNT = "/data/hf-cache"
DATASET_MOUNT = "/data/dataset"
"""The training dataset's one source; source i of several is at `/data/dataset-<i>`."""
EVALUATION_DATASET_MOUNT = "/data/evaluation-dataset"
CHECKPOINT_MOUNT = "/data/checkpoints"
OUTPUT_MOUNT = "/data/output"
LOG_MOUNT = "/data/logs"


@dataclass(frozen=True)
class Mounted:
    """A claim as one pod sees it: its volume and mount (none without a claim), and the directory (or file)
    the pod is told about."""

    path: str
    volumes: list[Manifest] = field(default_factory=list)
    mounts: list[Manifest] = field(default_factory=list)


def mount_claim(
    volume: str,
    claim_name: str,
    mount_path: str,
    *,
    sub_path: str | None = None,
    read_only: bool | None = None,
    inside: str = "",
) -> Mounted:
    """Claim ``claim_name`` as volume ``volume`` at ``mount_path`` (of its ``sub_path``), and ``inside`` it as
    the pod sees it. ``read_only`` None: writable, and the mount leaves `readOnly` to its default."""
    mount: Manifest = {"name": volume, "mountPath": mount_path}
    if read_only is not None:
        mount["readOnly"] = read_only
    if sub_path:
        mount["subPath"] = sub_path
    claim = {"claimName": claim_name, "readOnly": bool(read_only)}
    path = f"{mount_path}/{inside.lstrip('/')}" if inside else mount_path
    return Mounted(path, [{"name": volume, "persistentVolumeClaim": claim}], [mount])


def _on_claim(
    volume: str, pvc: api.PvcSource | None, mount_path: str, inside: str, read_only: bool | None = None
) -> Mounted:
    """``inside`` the claim ``pvc`` as mounted at ``mount_path``; without a claim, in the pod's /tmp (gone
    with the pod)."""
    if pvc is None:
        return Mounted(f"/tmp/{inside.lstrip('/')}")
    return mount_claim(volume, pvc.claim_name, mount_path, sub_path=pvc.path, read_only=read_only, inside=inside)


def model_cache_claim(job: api.GRPOJob) -> str:
    """The job's Hugging Face cache, which the model and the datasets named by id are downloaded into: the
    claim `spec.model.cache` names, or the job's own."""
    cache = job.spec.model.cache
    if cache is not None and cache.claim_name:
        return cache.claim_name
    return names.ChildNames(job.metadata.name).model_cache


def model_mount(job: api.GRPOJob) -> Mounted:
    """The model's claim, mounted read-only: the one holding `path`, or a hub model's cache (whose root is the
    path); a `path` without a claim is the image's own."""
    model = job.spec.model
    if model.id is not None:
        return mount_claim("model", model_cache_claim(job), HUB_CACHE_MOUNT, read_only=True)
    if model.pvc is None:
        return Mounted(str(model.path))
    return mount_claim(
        "model",
        model.pvc.claim_name,
        MODEL_MOUNT,
        sub_path=model.pvc.path,
        read_only=True,
        inside=str(model.path).strip("/"),
    )


def model_path(job: api.GRPOJob, model_commit: str | None = None) -> str:
    """Where the model directory is inside the pods: the path (in its claim), or for a hub id the snapshot of
    ``model_commit`` (the commit the download resolved) in the mounted cache."""
    model = job.spec.model
    if model.id is not None:
        if not model_commit:
            raise ValueError(f"spec.model.id {model.id}: no commit yet (the model's download has not finished)")
        return f"{HUB_CACHE_MOUNT}/{paths.hub_snapshot_path(model.id, model_commit)}"
    return model_mount(job).path


def hub_env(job: api.GRPOJob) -> list[Manifest]:
    """Environment of every pod that loads the model: the hub is never reached (`HF_HUB_OFFLINE=1`), and a
    hub model's cache is where `huggingface_hub` looks."""
    env = [{"name": endpoints.HF_HUB_OFFLINE, "value": "1"}]
    if job.spec.model.id is not None:
        env.append({"name": endpoints.HF_HUB_CACHE, "value": HUB_CACHE_MOUNT})
    return env


def dataset_cache_mount(job: api.GRPOJob) -> Mounted:
    """The job's Hugging Face cache, read-only at `HUB_CACHE_MOUNT`, for a pod that reads datasets named by id
    and does not load a hub model (whose mount, `model_mount`, is the same cache); nothing otherwise."""
    if job.spec.model.id is not None or not job.spec.hub_datasets():
        return Mounted("")
    return mount_claim("hub-cache", model_cache_claim(job), HUB_CACHE_MOUNT, read_only=True)


def dataset_mounts(job: api.GRPOJob, dataset_commits: Mapping[str, str] | None = None) -> list[Mounted]:
    """Each source of the training dataset, read-only, in the order of `spec.dataset`: the key of its
    ConfigMap, its path in its claim or the image, or the snapshot of a dataset named by id at the commit its
    download resolved (``dataset_commits``, `status.datasetCommits`) in the cache (`dataset_cache_mount`).
    One source is mounted at `DATASET_MOUNT`, several at `DATASET_MOUNT-<i>`."""
    sources = job.spec.dataset.all_sources()
    if len(sources) == 1:
        return [_dataset_mount(sources[0], "dataset", DATASET_MOUNT, dataset_commits)]
    return [
        _dataset_mount(source, f"dataset-{i}", f"{DATASET_MOUNT}-{i}", dataset_commits)
        for i, source in enumerate(sources)
    ]


def evaluation_dataset_mount(job: api.GRPOJob, dataset_commits: Mapping[str, str] | None = None) -> Mounted | None:
    """The evaluation's held-out dataset (`spec.evaluation.dataset`) as `dataset_mounts` mounts a training
    source; None without an evaluation."""
    evaluation = job.spec.evaluation
    if evaluation is None:
        return None
    return _dataset_mount(evaluation.dataset, "evaluation-dataset", EVALUATION_DATASET_MOUNT, dataset_commits)


def _dataset_mount(
    dataset: api.DatasetSource, name: str, mount_path: str, dataset_commits: Mapping[str, str] | None
) -> Mounted:
    if dataset.id is not None:
        key = hub.dataset_key(dataset)
        commit = (dataset_commits or {}).get(key)
        if not commit:
            raise ValueError(f"dataset {key}: no commit yet (its download has not finished)")
        return Mounted(f"{HUB_CACHE_MOUNT}/{paths.hub_snapshot_path(dataset.id, commit, 'dataset')}")
    if dataset.config_map is not None:
        volume = {"name": name, "configMap": {"name": dataset.config_map.name}}
        mount = {"name": name, "mountPath": mount_path, "readOnly": True}
        return Mounted(f"{mount_path}/{dataset.config_map.key}", [volume], [mount])
    if dataset.pvc is not None:
        return mount_claim(
            name, dataset.pvc.claim_name, mount_path, sub_path=dataset.pvc.path, read_only=True,
            inside=str(dataset.path),
        )  # fmt: skip
    return Mounted(str(dataset.path))


def checkpoint_mount(job: api.GRPOJob) -> Mounted:
    """The checkpoint claim and the checkpoint directory as the policy pods see it.

    The policy actor writes and reads checkpoints, so the claim is mounted on the `policy` workers.
    Without a claim, checkpoints stay in the policy pod's /tmp and go with it.
    """
    return _on_claim("checkpoints", job.spec.checkpointing.pvc, CHECKPOINT_MOUNT, paths.checkpoint_dir(job))


def output_claim(job: api.GRPOJob) -> api.PvcSource | None:
    """The claim the exported model goes to: `spec.output.pvc`, else the checkpoints' claim."""
    return job.spec.output.pvc or job.spec.checkpointing.pvc


def output_mount(job: api.GRPOJob) -> Mounted:
    """The output claim on the `policy` workers (rank 0 writes the exported model), and the output directory
    as they see it; without a claim, the policy pod's /tmp."""
    return _on_claim("output", output_claim(job), OUTPUT_MOUNT, paths.output_dir(job))


def output_model_status(job: api.GRPOJob, reported: str, step: int) -> api.OutputModelStatus:
    """`status.outputModel` from the trainer's report (a path inside the output volume's mount): the path
    inside the claim, so that a `spec.model` of `path` and `pvc` names it; its format is the one the job
    exports (`spec.output.format`)."""
    pvc = output_claim(job)
    output_format = job.spec.output.format
    if pvc is None:
        return api.OutputModelStatus(path=reported, step=step, format=output_format)
    path = f"{pvc.path.strip('/')}/{reported}" if pvc.path else reported
    return api.OutputModelStatus(path=path, claim_name=pvc.claim_name, step=step, format=output_format)


def log_mount(job: api.GRPOJob, *, read_only: bool) -> Mounted:
    """The log claim (`GRPOJobSpec.log_claim`) and the job's log directory as a pod sees it. Without a claim the
    logs stay in the pod's /tmp."""
    return _on_claim("logs", job.spec.log_claim, LOG_MOUNT, paths.log_dir(job), read_only)


def attempt_log_dir(log_dir: str, attempt: int) -> str:
    """The run directory of one trainer attempt inside the job's log directory (a TensorBoard run)."""
    return f"{log_dir}/attempt-{attempt}"


def share_claims(volumes: list[Manifest], mounts: list[Manifest]) -> tuple[list[Manifest], list[Manifest]]:
    """One volume per claim: the kubelet mounts a claim once per pod, so a second volume of the same
    claim (the model, dataset and checkpoints may share one) never mounts and the pod stays in
    ContainerCreating. Mounts of a dropped volume use the first; it is read-only only if all were."""
    first_by_claim: dict[str, Manifest] = {}
    renamed: dict[str, str] = {}
    kept: list[Manifest] = []
    for volume in volumes:
        claim = volume.get("persistentVolumeClaim", {}).get("claimName")
        if claim is None:
            kept.append(volume)
        elif claim in first_by_claim:
            first = first_by_claim[claim]
            renamed[volume["name"]] = first["name"]
            if not volume["persistentVolumeClaim"].get("readOnly", False):
                first["persistentVolumeClaim"]["readOnly"] = False
        else:
            first_by_claim[claim] = {**volume, "persistentVolumeClaim": dict(volume["persistentVolumeClaim"])}
            kept.append(first_by_claim[claim])
    return kept, [{**mount, "name": renamed.get(mount["name"], mount["name"])} for mount in mounts]
