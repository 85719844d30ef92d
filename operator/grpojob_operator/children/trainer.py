"""The trainer: the Job of each attempt (the Ray driver that runs the GRPO loop), its ServiceAccount, Role and
RoleBinding, and the ConfigMap of its config (the job itself), which it also reports its progress into."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from grpojob_api import endpoints, kubeyaml
from grpojob_api import v1alpha1 as api
from grpojob_api.progress import CANNOT_RUN_EXIT_CODE, PREEMPTION_EXIT_CODES
from grpojob_operator import names
from grpojob_operator.children import claims, pod
from grpojob_operator.children.endpoints import endpoints_env_from, endpoints_volume, pod_attempt_env
from grpojob_operator.children.meta import Manifest, job_ref, labels, metadata
from grpojob_operator.children.raycluster import ray_auth_env
from grpojob_operator.settings import OperatorSettings

CONFIG_FILE = "grpojob.yaml"
CONFIG_MOUNT = "/etc/grpojob"


def render_job_config(job: api.GRPOJob) -> str:
    """The trainer's config: the GRPOJob itself (name, namespace and spec), as YAML that `grpojob train`
    reads back unchanged (its loader reads YAML as kubectl does). Nulls stay: a
    nullable field's null is a value (`importanceSamplingCap: null` disables the cap), any other null
    reads as absent."""
    document = {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": job.metadata.name, "namespace": job.metadata.namespace},
        "spec": job.spec.model_dump(mode="json", by_alias=True),
    }
    return kubeyaml.dump(document)


def build_config_map(job: api.GRPOJob) -> Manifest:
    """`<job>-config`: the trainer's config (`render_job_config`). The trainer adds its progress reports
    (`grpojob_api.progress.REPORT_KEYS`), which the operator leaves there."""
    job_name, _ = job_ref(job)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(job, names.ChildNames(job_name).config, "config"),
        "data": {CONFIG_FILE: render_job_config(job)},
    }


def build_trainer_rbac(job: api.GRPOJob) -> list[Manifest]:
    """ServiceAccount, Role and RoleBinding of the trainer: it may read and update `<job>-config`, where it
    reports its progress, and nothing else."""
    job_name, _ = job_ref(job)
    child = names.ChildNames(job_name)
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": metadata(job, child.trainer, "trainer"),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": metadata(job, child.trainer, "trainer"),
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": [child.config],
                    "verbs": ["get", "update", "patch"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": metadata(job, child.trainer, "trainer"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": child.trainer},
            "subjects": [{"kind": "ServiceAccount", "name": child.trainer}],
        },
    ]


def tracking_env(job: api.GRPOJob) -> list[Manifest]:
    """The trainer's secret environment variables for W&B (`WANDB_API_KEY` from its Secret); the rest of
    `spec.logging` the trainer reads from the job itself."""
    wandb = job.spec.logging.wandb
    if wandb is None or wandb.api_key_secret is None:
        return []
    ref = wandb.api_key_secret
    return [{"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def tracking_env_from(job: api.GRPOJob) -> list[Manifest]:
    """MLflow's credentials: every key of `spec.logging.mlflow.credentialsSecret` as an environment variable."""
    mlflow = job.spec.logging.mlflow
    if mlflow is None or mlflow.credentials_secret is None:
        return []
    return [{"secretRef": {"name": mlflow.credentials_secret}}]


def _trainer_resources() -> Manifest:
    return {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}


def _trainer_image(job: api.GRPOJob, settings: OperatorSettings) -> str:
    return job.spec.images.trainer or settings.default_trainer_image()


def trainer_admission_template(job: api.GRPOJob, settings: OperatorSettings) -> Manifest:
    """The trainer's pod as Kueue admits it (`kueue.pod_sets`): its container's requests and its scheduling.
    Nothing else: a hub model's path needs the commit its download resolves, which follows admission."""
    child = names.ChildNames(job.metadata.name)
    container = pod.container("trainer", _trainer_image(job, settings), resources=_trainer_resources())
    return pod.hardened_pod(
        labels(job, "trainer"),
        [container],
        [],
        job.spec.scheduling.trainer,
        service_account=child.trainer,
        run_once=True,
    )


def build_trainer_job(
    job: api.GRPOJob,
    settings: OperatorSettings,
    attempt: int,
    model_commit: str | None = None,
    dataset_commits: Mapping[str, str] | None = None,
    stop_seconds: int | None = None,
) -> Manifest:
    """The trainer Job of one attempt: joins the Ray cluster at `RAY_GCS_ADDRESS` (from the endpoints
    ConfigMap) and runs the GRPO loop. The Job itself never retries: the operator counts attempts. A hub
    model (`spec.model.id`) is loaded at ``model_commit``, the commit its download resolved, and each dataset
    named by id at its commit in ``dataset_commits`` (`status.datasetCommits`). Its pod's grace period is
    `spec.checkpointing.gracePeriodSeconds`, or, unset, one that fits ``stop_seconds``, what an earlier attempt
    measured a stop to need (`status.checkpointing.stopSeconds`; `CheckpointSpec.grace_period`)."""
    job_name, _ = job_ref(job)
    child = names.ChildNames(job_name)
    attempt_label = {names.ATTEMPT_LABEL: str(attempt)}
    model, hub_cache = claims.model_mount(job), claims.dataset_cache_mount(job)
    datasets = claims.dataset_mounts(job, dataset_commits)
    evaluation = claims.evaluation_dataset_mount(job, dataset_commits) or claims.Mounted("")
    logs = claims.log_mount(job, read_only=False)
    endpoints_vol, endpoints_mount = endpoints_volume(job)
    volumes, mounts = claims.share_claims(
        [
            _config_volume(child),
            endpoints_vol,
            {"name": "tmp", "emptyDir": {}},
            *model.volumes,
            *hub_cache.volumes,
            *(volume for dataset in datasets for volume in dataset.volumes),
            *evaluation.volumes,
            *logs.volumes,
        ],
        [
            {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
            endpoints_mount,
            {"name": "tmp", "mountPath": "/tmp"},
            *model.mounts,
            *hub_cache.mounts,
            *(mount for dataset in datasets for mount in dataset.mounts),
            *evaluation.mounts,
            *logs.mounts,
        ],
    )
    trainer_env = endpoints.TrainerEnv(
        progress_config_map=child.config,
        model_path=claims.model_path(job, model_commit),
        dataset_paths=[dataset.path for dataset in datasets],
        evaluation_dataset_path=evaluation.path or None,
        checkpoint_dir=claims.checkpoint_mount(job).path,
        output_dir=claims.output_mount(job).path,
        log_dir=claims.attempt_log_dir(logs.path, attempt),
        metrics_port=endpoints.TRAINER_METRICS_PORT,
    )
    container = pod.container(
        "trainer",
        _trainer_image(job, settings),
        command=["grpojob", "train", "--config", f"{CONFIG_MOUNT}/{CONFIG_FILE}"],
        envFrom=[*endpoints_env_from(job), *tracking_env_from(job)],
        env=[
            *ray_auth_env(job),
            *claims.hub_env(job),
            pod_attempt_env(attempt),
            *trainer_env.env(),
            {"name": endpoints.POD_NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            *tracking_env(job),
        ],
        ports=[{"name": "metrics", "containerPort": endpoints.TRAINER_METRICS_PORT}],
        resources=_trainer_resources(),
        volumeMounts=mounts,
    )
    template = pod.hardened_pod(
        {**labels(job, "trainer"), **attempt_label},
        [container],
        volumes,
        job.spec.scheduling.trainer,
        service_account=child.trainer,
        run_once=True,
    )
    template["spec"]["terminationGracePeriodSeconds"] = job.spec.checkpointing.grace_period(stop_seconds)
    manifest = pod.run_once_job(metadata(job, child.trainer, "trainer", attempt_label), template)
    # A pod ended by a disruption (eviction, preemption, a node drain), or a trainer that stopped on notice or
    # lost a Ray worker's node (its exit codes), says so in the Job's Failed condition, which outlives the pod: the
    # operator then retries without counting it against spec.backoffLimit. A trainer that cannot run as specified
    # says so by its exit code there too, and the operator fails the job without a retry.
    manifest["spec"]["podFailurePolicy"] = {
        "rules": [
            {"action": "FailJob", "onPodConditions": [DISRUPTED]},
            {"action": "FailJob", "onExitCodes": trainer_exits(PREEMPTION_EXIT_CODES)},
            {"action": "FailJob", "onExitCodes": trainer_exits([CANNOT_RUN_EXIT_CODE])},
        ]
    }
    return manifest


def trainer_exits(codes: Iterable[int]) -> Manifest:
    """A pod failure policy rule's match of the trainer container exiting with one of ``codes``."""
    return {"containerName": "trainer", "operator": "In", "values": sorted(codes)}  # the API wants them ordered


DISRUPTED = {"type": "DisruptionTarget", "status": "True"}
"""The pod condition Kubernetes sets on a pod it is about to stop for a disruption."""


def _config_volume(child: names.ChildNames) -> Manifest:
    """The trainer's config file from its ConfigMap: the file only, not the progress the trainer writes beside it."""
    return {
        "name": "config",
        "configMap": {"name": child.config, "items": [{"key": CONFIG_FILE, "path": CONFIG_FILE}]},
    }
