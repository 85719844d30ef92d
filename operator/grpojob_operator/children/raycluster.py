"""The job's Ray cluster: the RayCluster (a CPU head that runs no work, and the worker groups of the job's
placement: `generation` and `policy`, or one `colocated` group) and the headless Service over the
generation servers."""

from __future__ import annotations

import json

from grpojob_api import endpoints, placement
from grpojob_api import v1alpha1 as api
from grpojob_api.placement import WorkerGroup
from grpojob_operator import names
from grpojob_operator.children import claims, pod
from grpojob_operator.children.meta import Manifest, job_ref, labels, metadata
from grpojob_operator.settings import OperatorSettings

GPU_RESOURCE = "nvidia.com/gpu"
RAY_TMP_MOUNT = "/tmp"  # Ray's session directory (/tmp/ray) and the images' HOME and caches


def ray_auth_env(job: api.GRPOJob) -> list[Manifest]:
    """Every process of the job's Ray cluster (the Ray pods, the trainer, NeMo Gym pods that join it)
    runs with token authentication and the job's token, from the Secret KubeRay creates for the
    RayCluster. KubeRay would add the same to its own pods; they carry it explicitly so every pod reads
    alike."""
    job_name, _ = job_ref(job)
    secret = {"name": names.ChildNames(job_name).ray_token_secret, "key": endpoints.RAY_AUTH_TOKEN_SECRET_KEY}
    return [
        {"name": endpoints.RAY_AUTH_MODE, "value": endpoints.RAY_AUTH_MODE_TOKEN},
        {"name": endpoints.RAY_AUTH_TOKEN, "valueFrom": {"secretKeyRef": secret}},
    ]


def _worker_resources(resources: api.WorkerResources, gpus: int) -> Manifest:
    """A worker container's resources: its CPU request (no CPU limit), memory as request and limit, and its
    GPUs."""
    cpu, memory, _ = resources.for_gpus(gpus)
    requests, limits = {"cpu": cpu, "memory": memory}, {"memory": memory}
    if gpus:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(gpus)
    return {"requests": requests, "limits": limits}


def _ray_scratch_volumes(shared_memory: str | None = None) -> list[Manifest]:
    shm: Manifest = {"medium": "Memory"} | ({"sizeLimit": shared_memory} if shared_memory else {})
    return [{"name": "tmp", "emptyDir": {}}, {"name": "shm", "emptyDir": shm}]


def _ray_scratch_mounts() -> list[Manifest]:
    """Where a Ray container writes, its root filesystem being read-only: /tmp (Ray's session
    directory /tmp/ray, HOME and caches) and /dev/shm (the object store)."""
    return [{"name": "tmp", "mountPath": RAY_TMP_MOUNT}, {"name": "shm", "mountPath": "/dev/shm"}]


def _worker_group(job: api.GRPOJob, group: WorkerGroup, image: str) -> Manifest:
    """A worker group of the layout: engines serve on the generation port, ranks mount the checkpoint and
    output claims; a colocated group does both, with the policy's resources and scheduling."""
    spec = job.spec
    model = claims.model_mount(job)
    volumes, mounts = model.volumes, model.mounts
    serves = endpoints.GENERATION_GROUP in group.ray_resources
    trains = endpoints.POLICY_GROUP in group.ray_resources
    if trains:
        checkpoints, output = claims.checkpoint_mount(job), claims.output_mount(job)
        volumes, mounts = claims.share_claims(
            [*volumes, *checkpoints.volumes, *output.volumes], [*mounts, *checkpoints.mounts, *output.mounts]
        )
    resources = spec.training.resources if trains else spec.generation.resources
    scheduling = spec.scheduling.policy if trains else spec.scheduling.generation
    _, _, shared_memory = resources.for_gpus(group.gpus)
    worker = pod.container(
        "ray-worker",
        image,
        env=[*ray_auth_env(job), *claims.hub_env(job)],
        resources=_worker_resources(resources, group.gpus),
        ports=[{"name": "http", "containerPort": endpoints.GENERATION_PORT}] if serves else [],
        volumeMounts=[*mounts, *_ray_scratch_mounts()],
    )
    return {
        "groupName": group.name,
        "replicas": group.replicas,
        "minReplicas": group.replicas,
        "maxReplicas": group.replicas,
        # Custom Ray resources let the trainer place its actors on the right pods. KubeRay pastes the value
        # into a shell command line, so it is single-quoted, as KubeRay quotes its own.
        "rayStartParams": {"resources": f"'{json.dumps(group.ray_resources)}'"},
        "template": pod.hardened_pod(
            labels(job, group.name) | ({names.SERVES_GENERATION_LABEL: "true"} if serves else {}),
            [worker],
            [*volumes, *_ray_scratch_volumes(shared_memory)],
            scheduling,
        ),
    }


def build_raycluster(job: api.GRPOJob, settings: OperatorSettings) -> Manifest:
    """The RayCluster: a CPU head that runs no work, and the worker groups of the job's placement
    (`grpojob_api.placement.layout`), which mount the model's claim (the trainer tells them its path)."""
    job_name, _ = job_ref(job)
    image = job.spec.images.ray or settings.ray_image
    head = pod.container(
        "ray-head",
        image,
        env=[*ray_auth_env(job), *claims.hub_env(job)],
        resources={"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}},
        ports=[
            {"name": "gcs", "containerPort": endpoints.GCS_PORT},
            {"name": "dashboard", "containerPort": endpoints.DASHBOARD_PORT},
            {"name": "client", "containerPort": endpoints.RAY_CLIENT_PORT},
        ],
        volumeMounts=_ray_scratch_mounts(),
    )
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": metadata(job, names.ChildNames(job_name).raycluster, "ray"),
        "spec": {
            "rayVersion": settings.ray_version,
            # KubeRay creates the Secret `names.ChildNames.ray_token_secret` with a random token and hands
            # it to the Ray pods; the operator hands it to the trainer and the NeMo Gym pods.
            "authOptions": {"mode": "token"},
            "enableInTreeAutoscaling": False,
            "headGroupSpec": {
                "serviceType": "ClusterIP",
                "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
                # Ray pods need no Kubernetes API token (no autoscaler): the hardened pod mounts none.
                "template": pod.hardened_pod(
                    labels(job, names.HEAD_COMPONENT), [head], _ray_scratch_volumes(), job.spec.scheduling.head
                ),
            },
            "workerGroupSpecs": [_worker_group(job, group, image) for group in placement.layout(job.spec).groups],
        },
    }


def build_generation_service(job: api.GRPOJob) -> Manifest:
    """Headless Service over the pods that serve generation (the `generation` or `colocated` workers): the
    OpenAI-compatible policy endpoint."""
    job_name, _ = job_ref(job)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(job, names.ChildNames(job_name).generation_service, "generation"),
        "spec": {
            "clusterIP": "None",
            "selector": {names.RAY_CLUSTER_LABEL: job_name, names.SERVES_GENERATION_LABEL: "true"},
            "ports": [{"name": "http", "port": endpoints.GENERATION_PORT, "targetPort": endpoints.GENERATION_PORT}],
            "publishNotReadyAddresses": False,
        },
    }
