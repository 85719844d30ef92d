"""Pure functions that build every child of a GRPOJob as a dict. No API calls here.

Each builder takes the validated job and the operator settings and returns the complete object,
owner reference included, so creating it is one POST and tests need no cluster.
"""

from __future__ import annotations

import json
from typing import Any

from grpojob_api import endpoints, kubeyaml, paths
from grpojob_api import v1alpha1 as api
from grpojob_operator import names, nemo_gym
from grpojob_operator.settings import OperatorSettings

GPU_RESOURCE = "nvidia.com/gpu"
CONFIG_FILE = "grpojob.yaml"
CONFIG_MOUNT = "/etc/grpojob"
DATASET_MOUNT = "/data/dataset"
MODEL_MOUNT = "/data/model"
HUB_CACHE_MOUNT = "/data/hf-cache"
CHECKPOINT_MOUNT = "/data/checkpoints"
OUTPUT_MOUNT = "/data/output"
TERMINATION_LOG = "/dev/termination-log"
LOG_MOUNT = "/data/logs"
NON_ROOT_UID = 1000
RAY_TMP_MOUNT = "/tmp"  # Ray's session directory (/tmp/ray) and the images' HOME and caches

Manifest = dict[str, Any]


def _job_ref(job: api.GRPOJob) -> tuple[str, str]:
    if not job.metadata.namespace:
        raise ValueError("the GRPOJob has no namespace")
    return job.metadata.name, job.metadata.namespace


def owner_reference(job: api.GRPOJob) -> dict[str, Any]:
    """The controller owner reference that makes a child belong to (and be deleted with) the job."""
    if not job.metadata.uid:
        raise ValueError("the GRPOJob has no uid (build children from the object read from the API)")
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "name": job.metadata.name,
        "uid": job.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _labels(job: api.GRPOJob, component: str) -> dict[str, str]:
    owner = owner_reference(job)
    return names.job_labels(owner["name"], owner["uid"], component)


def _metadata(job: api.GRPOJob, name: str, component: str, extra_labels: dict[str, str] | None = None) -> Manifest:
    _, namespace = _job_ref(job)
    return {
        "name": name,
        "namespace": namespace,
        "labels": {**_labels(job, component), **(extra_labels or {})},
        "ownerReferences": [owner_reference(job)],
    }


def pod_security_context() -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": NON_ROOT_UID,
        "runAsGroup": NON_ROOT_UID,
        "fsGroup": NON_ROOT_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> Manifest:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def read_only_container_security_context() -> Manifest:
    """A container that writes only to its volumes (every image keeps HOME and caches under /tmp)."""
    return {**container_security_context(), "readOnlyRootFilesystem": True}


def ray_auth_env(job: api.GRPOJob) -> list[Manifest]:
    """Every process of the job's Ray cluster (the Ray pods, the trainer, NeMo Gym pods that join it)
    runs with token authentication and the job's token, from the Secret KubeRay creates for the
    RayCluster. KubeRay would add the same to its own pods; they carry it explicitly so every pod reads
    alike."""
    job_name, _ = _job_ref(job)
    secret = {"name": names.ChildNames(job_name).ray_token_secret, "key": endpoints.RAY_AUTH_TOKEN_SECRET_KEY}
    return [
        {"name": endpoints.RAY_AUTH_MODE, "value": endpoints.RAY_AUTH_MODE_TOKEN},
        {"name": endpoints.RAY_AUTH_TOKEN, "valueFrom": {"secretKeyRef": secret}},
    ]


def service_dns(service: str, namespace: str, settings: OperatorSettings) -> str:
    return f"{service}.{namespace}.svc.{settings.cluster_domain}"


def scheduled(template: Manifest, scheduling: api.PodScheduling) -> Manifest:
    """A pod template with one role's scheduling (`spec.scheduling.<role>`) applied: node selector,
    tolerations, affinity, priority class, scheduler, and extra labels and annotations under the
    template's own (the operator's labels win)."""
    metadata = dict(template.get("metadata", {}))
    spec = dict(template["spec"])
    if scheduling.labels:
        metadata["labels"] = {**scheduling.labels, **metadata.get("labels", {})}
    if scheduling.annotations:
        metadata["annotations"] = {**scheduling.annotations, **metadata.get("annotations", {})}
    if scheduling.node_selector:
        spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **scheduling.node_selector}
    if scheduling.tolerations:
        own = [t.model_dump(by_alias=True, exclude_defaults=True) for t in scheduling.tolerations]
        spec["tolerations"] = [*spec.get("tolerations", []), *own]
    if scheduling.affinity is not None and scheduling.affinity.to_pod():
        spec["affinity"] = scheduling.affinity.to_pod()
    if scheduling.priority_class_name:
        spec["priorityClassName"] = scheduling.priority_class_name
    if scheduling.scheduler_name:
        spec["schedulerName"] = scheduling.scheduler_name
    return {**template, "metadata": metadata, "spec": spec}


# ------------------------------------------------------------------------------------------------
# volumes


def _pvc_volume(volume_name: str, source: api.PvcSource, read_only: bool) -> Manifest:
    return {"name": volume_name, "persistentVolumeClaim": {"claimName": source.claim_name, "readOnly": read_only}}


def model_path(job: api.GRPOJob, model_commit: str | None = None) -> str:
    """Where the model directory is inside the pods: the path (in its claim), or for a hub id the snapshot of
    ``model_commit`` (the commit the download resolved) in the mounted cache."""
    model = job.spec.model
    if model.id is not None:
        if not model_commit:
            raise ValueError(f"spec.model.id {model.id}: no commit yet (the model's download has not finished)")
        return f"{HUB_CACHE_MOUNT}/{paths.hub_snapshot_path(model.id, model_commit)}"
    path = str(model.path)
    return f"{MODEL_MOUNT}/{path.strip('/')}" if model.pvc else path


def model_cache_claim(job: api.GRPOJob) -> str:
    """The claim a hub model is downloaded into: the one `spec.model.cache` names, or the job's own."""
    cache = job.spec.model.cache
    if cache is not None and cache.claim_name:
        return cache.claim_name
    return names.ChildNames(job.metadata.name).model_cache


def hub_env(job: api.GRPOJob) -> list[Manifest]:
    """Environment of every pod that loads the model: the hub is never reached (`HF_HUB_OFFLINE=1`), and a
    hub model's cache is where `huggingface_hub` looks."""
    env = [{"name": endpoints.HF_HUB_OFFLINE, "value": "1"}]
    if job.spec.model.id is not None:
        env.append({"name": endpoints.HF_HUB_CACHE, "value": HUB_CACHE_MOUNT})
    return env


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


def _model_volumes(job: api.GRPOJob) -> tuple[list[Manifest], list[Manifest]]:
    """The model's claim, mounted read-only: the one holding `path`, or a hub model's cache."""
    model = job.spec.model
    if model.id is not None:
        cache = {"name": "model", "persistentVolumeClaim": {"claimName": model_cache_claim(job), "readOnly": True}}
        return [cache], [{"name": "model", "mountPath": HUB_CACHE_MOUNT, "readOnly": True}]
    if model.pvc is None:
        return [], []
    mount = {"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}
    if model.pvc.path:
        mount["subPath"] = model.pvc.path
    return [_pvc_volume("model", model.pvc, read_only=True)], [mount]


def output_claim(job: api.GRPOJob) -> api.PvcSource | None:
    """The claim the exported model goes to: `spec.output.pvc`, else the checkpoints' claim."""
    return job.spec.output.pvc or job.spec.checkpointing.pvc


def output_volume(job: api.GRPOJob) -> tuple[list[Manifest], list[Manifest], str]:
    """The output claim's volume and mount on the `policy` workers (rank 0 writes the exported model), and
    the output directory as they see it; without a claim, the policy pod's /tmp."""
    pvc = output_claim(job)
    inside = paths.output_dir(job).lstrip("/")
    if pvc is None:
        return [], [], f"/tmp/{inside}"
    mount = {"name": "output", "mountPath": OUTPUT_MOUNT}
    if pvc.path:
        mount["subPath"] = pvc.path
    return [_pvc_volume("output", pvc, read_only=False)], [mount], f"{OUTPUT_MOUNT}/{inside}"


def output_model_status(job: api.GRPOJob, reported: str, step: int) -> api.OutputModelStatus:
    """`status.outputModel` from the trainer's report (a path inside the output volume's mount): the path
    inside the claim, so that a `spec.model` of `path` and `pvc` names it."""
    pvc = output_claim(job)
    if pvc is None:
        return api.OutputModelStatus(path=reported, step=step)
    path = f"{pvc.path.strip('/')}/{reported}" if pvc.path else reported
    return api.OutputModelStatus(path=path, claim_name=pvc.claim_name, step=step)


# ------------------------------------------------------------------------------------------------
# the model's download (a hub id)


def build_model_cache_claim(job: api.GRPOJob) -> Manifest:
    """The hub cache the job creates when `spec.model.cache` names no claim (deleted with the job)."""
    job_name, _ = _job_ref(job)
    cache = job.spec.model.cache or api.ModelCacheSpec()
    spec: Manifest = {"accessModes": [cache.access_mode], "resources": {"requests": {"storage": cache.size}}}
    if cache.storage_class_name:
        spec["storageClassName"] = cache.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(job, names.ChildNames(job_name).model_cache, "model-cache"),
        "spec": spec,
    }


def _run_once_job(job: api.GRPOJob, metadata: Manifest, labels: dict[str, str], pod_spec: Manifest) -> Manifest:
    """A batch/v1 Job whose one pod runs once (never restarted, never retried: the operator decides what
    follows a failure), placed as the trainer is (`spec.scheduling.trainer`: CPU pods of the trainer's
    image)."""
    template = {"metadata": {"labels": labels}, "spec": {"restartPolicy": "Never", **pod_spec}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {"backoffLimit": 0, "template": scheduled(template, job.spec.scheduling.trainer)},
    }


def build_model_download_job(job: api.GRPOJob, settings: OperatorSettings) -> Manifest:
    """The Job that downloads `spec.model.id` into the cache claim once, before any Ray pod starts
    (`grpojob download-model`): it reports the commit it resolved, or why it failed, in its termination
    message, which the operator reads. Never retried: an unknown id or a missing token does not heal."""
    job_name, _ = _job_ref(job)
    model = job.spec.model
    command = ["grpojob", "download-model", str(model.id), "--cache", HUB_CACHE_MOUNT]
    command += ["--termination-log", TERMINATION_LOG]
    if model.revision:
        command += ["--revision", model.revision]
    env: list[Manifest] = [
        {"name": "HOME", "value": "/tmp"},
        {"name": endpoints.HF_HUB_CACHE, "value": HUB_CACHE_MOUNT},
    ]
    if model.offline:
        env.append({"name": endpoints.HF_HUB_OFFLINE, "value": "1"})
    if model.token_secret is not None:
        ref = {"name": model.token_secret.name, "key": model.token_secret.key}
        env.append({"name": endpoints.HF_TOKEN, "valueFrom": {"secretKeyRef": ref}})
    return _run_once_job(
        job,
        _metadata(job, names.ChildNames(job_name).model_download, "model-download"),
        _labels(job, "model-download"),
        {
            "automountServiceAccountToken": False,
            "securityContext": pod_security_context(),
            "volumes": [
                {"name": "cache", "persistentVolumeClaim": {"claimName": model_cache_claim(job)}},
                {"name": "tmp", "emptyDir": {}},
            ],
            "containers": [
                {
                    "name": "download",
                    "image": job.spec.images.trainer or settings.default_trainer_image(),
                    "command": command,
                    "env": env,
                    "terminationMessagePath": TERMINATION_LOG,
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
                    "volumeMounts": [
                        {"name": "cache", "mountPath": HUB_CACHE_MOUNT},
                        {"name": "tmp", "mountPath": "/tmp"},
                    ],
                    "securityContext": read_only_container_security_context(),
                }
            ],
        },
    )


# ------------------------------------------------------------------------------------------------
# RayCluster


def _worker_resources(gpus: int) -> Manifest:
    if gpus == 0:
        return {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}
    memory = f"{32 * gpus}Gi"
    return {
        "requests": {"cpu": str(8 * gpus), "memory": memory, GPU_RESOURCE: str(gpus)},
        "limits": {"memory": memory, GPU_RESOURCE: str(gpus)},
    }


def checkpoint_volume(job: api.GRPOJob) -> tuple[list[Manifest], list[Manifest], str]:
    """The checkpoint claim's volume and mount, and the checkpoint directory as the policy pods see it.

    The policy actor writes and reads checkpoints, so the claim is mounted on the `policy` workers.
    Without a claim, checkpoints stay in the policy pod's /tmp and go with it.
    """
    pvc = job.spec.checkpointing.pvc
    if pvc is None:
        return [], [], f"/tmp/{paths.checkpoint_dir(job)}"
    mount = {"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT}
    if pvc.path:
        mount["subPath"] = pvc.path
    inside = paths.checkpoint_dir(job).lstrip("/")
    return [_pvc_volume("checkpoints", pvc, read_only=False)], [mount], f"{CHECKPOINT_MOUNT}/{inside}"


def log_volume(job: api.GRPOJob, *, read_only: bool) -> tuple[list[Manifest], list[Manifest], str]:
    """The log claim's volume and mount (`GRPOJobSpec.log_claim`), and the job's log directory as a pod sees it.
    Without a claim the logs stay in the pod's /tmp."""
    pvc = job.spec.log_claim
    if pvc is None:
        return [], [], f"/tmp/{paths.log_dir(job)}"
    mount = {"name": "logs", "mountPath": LOG_MOUNT, "readOnly": read_only}
    if pvc.path:
        mount["subPath"] = pvc.path
    inside = paths.log_dir(job).lstrip("/")
    return [_pvc_volume("logs", pvc, read_only=read_only)], [mount], f"{LOG_MOUNT}/{inside}"


def attempt_log_dir(log_dir: str, attempt: int) -> str:
    """The run directory of one trainer attempt inside the job's log directory (a TensorBoard run)."""
    return f"{log_dir}/attempt-{attempt}"


def _ray_scratch_volumes() -> list[Manifest]:
    return [{"name": "tmp", "emptyDir": {}}, {"name": "shm", "emptyDir": {"medium": "Memory"}}]


def _ray_scratch_mounts() -> list[Manifest]:
    """Where a Ray container writes, its root filesystem being read-only: /tmp (Ray's session
    directory /tmp/ray, HOME and caches) and /dev/shm (the object store)."""
    return [{"name": "tmp", "mountPath": RAY_TMP_MOUNT}, {"name": "shm", "mountPath": "/dev/shm"}]


def _worker_group(
    job: api.GRPOJob, group: str, replicas: int, gpus: int, image: str, ports: list[Manifest]
) -> Manifest:
    volumes, mounts = _model_volumes(job)
    resource_units = 1  # of the group's custom Ray resource: one actor per pod, or per policy rank
    if group == endpoints.POLICY_GROUP:
        resource_units = job.spec.training.ranks_per_replica
        checkpoint_volumes, checkpoint_mounts, _ = checkpoint_volume(job)
        output_volumes, output_mounts, _ = output_volume(job)
        volumes, mounts = share_claims(
            [*volumes, *checkpoint_volumes, *output_volumes], [*mounts, *checkpoint_mounts, *output_mounts]
        )
    labels = _labels(job, group)
    return {
        "groupName": group,
        "replicas": replicas,
        "minReplicas": replicas,
        "maxReplicas": replicas,
        # A custom Ray resource per group lets the trainer place its actors on the right pods. KubeRay
        # pastes the value into a shell command line, so it is single-quoted, as KubeRay quotes its own.
        "rayStartParams": {"resources": f"'{json.dumps({group: resource_units})}'"},
        "template": scheduled(
            {
                "metadata": {"labels": labels},
                "spec": {
                    "securityContext": pod_security_context(),
                    "automountServiceAccountToken": False,
                    "volumes": [*volumes, *_ray_scratch_volumes()],
                    "containers": [
                        {
                            "name": "ray-worker",
                            "image": image,
                            "env": [*ray_auth_env(job), *hub_env(job)],
                            "resources": _worker_resources(gpus),
                            "ports": ports,
                            "volumeMounts": [*mounts, *_ray_scratch_mounts()],
                            "securityContext": read_only_container_security_context(),
                        }
                    ],
                },
            },
            _role_scheduling(job, group),
        ),
    }


def _role_scheduling(job: api.GRPOJob, group: str) -> api.PodScheduling:
    return job.spec.scheduling.generation if group == endpoints.GENERATION_GROUP else job.spec.scheduling.policy


def build_raycluster(job: api.GRPOJob, settings: OperatorSettings) -> Manifest:
    """The RayCluster: a CPU head that runs no work, and the `generation` and `policy` GPU groups (which
    mount the model's claim; the trainer tells them the model's path)."""
    job_name, _ = _job_ref(job)
    names_ = names.ChildNames(job_name)
    image = job.spec.images.ray or settings.ray_image
    generation, training = job.spec.generation, job.spec.training
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": _metadata(job, names_.raycluster, "ray"),
        "spec": {
            "rayVersion": settings.ray_version,
            # KubeRay creates the Secret `names.ChildNames.ray_token_secret` with a random token and hands
            # it to the Ray pods; the operator hands it to the trainer and the NeMo Gym pods.
            "authOptions": {"mode": "token"},
            "enableInTreeAutoscaling": False,
            "headGroupSpec": {
                "serviceType": "ClusterIP",
                "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
                "template": scheduled(
                    {
                        "metadata": {"labels": _labels(job, "ray-head")},
                        "spec": {
                            "securityContext": pod_security_context(),
                            # Ray pods need no Kubernetes API token (no autoscaler): none is mounted.
                            "automountServiceAccountToken": False,
                            "volumes": _ray_scratch_volumes(),
                            "containers": [
                                {
                                    "name": "ray-head",
                                    "image": image,
                                    "env": [*ray_auth_env(job), *hub_env(job)],
                                    "resources": {
                                        "requests": {"cpu": "2", "memory": "8Gi"},
                                        "limits": {"memory": "8Gi"},
                                    },
                                    "ports": [
                                        {"name": "gcs", "containerPort": endpoints.GCS_PORT},
                                        {"name": "dashboard", "containerPort": endpoints.DASHBOARD_PORT},
                                        {"name": "client", "containerPort": endpoints.RAY_CLIENT_PORT},
                                    ],
                                    "volumeMounts": _ray_scratch_mounts(),
                                    "securityContext": read_only_container_security_context(),
                                }
                            ],
                        },
                    },
                    job.spec.scheduling.head,
                ),
            },
            "workerGroupSpecs": [
                _worker_group(
                    job,
                    endpoints.GENERATION_GROUP,
                    generation.replicas,
                    generation.gpus_per_replica,
                    image,
                    [{"name": "http", "containerPort": endpoints.GENERATION_PORT}],
                ),
                _worker_group(job, endpoints.POLICY_GROUP, training.replicas, training.gpus_per_replica, image, []),
            ],
        },
    }


# ------------------------------------------------------------------------------------------------
# config, services, endpoints, progress


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
    job_name, _ = _job_ref(job)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, names.ChildNames(job_name).config, "config"),
        "data": {CONFIG_FILE: render_job_config(job)},
    }


def build_generation_service(job: api.GRPOJob) -> Manifest:
    """Headless Service over the generation workers: the OpenAI-compatible policy endpoint."""
    job_name, _ = _job_ref(job)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, names.ChildNames(job_name).generation_service, "generation"),
        "spec": {
            "clusterIP": "None",
            "selector": {names.RAY_CLUSTER_LABEL: job_name, names.RAY_GROUP_LABEL: endpoints.GENERATION_GROUP},
            "ports": [{"name": "http", "port": endpoints.GENERATION_PORT, "targetPort": endpoints.GENERATION_PORT}],
            "publishNotReadyAddresses": False,
        },
    }


def build_network_policy(job: api.GRPOJob) -> Manifest:
    """Only the job's own pods reach the job's pods: the Ray head's GCS, dashboard and client ports,
    Ray's ports between nodes, the generation servers and the environments. The job's pods select each
    other by name and uid; traffic out of them is not restricted. Open to anyone: the ports meant for
    readers outside the job, the trainer's metrics (Prometheus) and TensorBoard (Ray listens on
    neither)."""
    job_name, _ = _job_ref(job)
    own = owner_reference(job)
    pods = {names.JOB_LABEL: job_name, names.JOB_UID_LABEL: own["uid"]}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(job, names.ChildNames(job_name).network_policy, "network"),
        "spec": {
            "podSelector": {"matchLabels": pods},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": pods}}]},
                {"ports": [{"port": endpoints.TRAINER_METRICS_PORT}, {"port": endpoints.TENSORBOARD_PORT}]},
            ],
        },
    }


def environment_urls(job: api.GRPOJob, settings: OperatorSettings) -> dict[str, str]:
    """Base URL of each environment's Service, by environment name; a NeMo Gym environment's URL also
    under its agent's name, which NeMo Gym's dataset rows carry in `agent_ref.name`."""
    job_name, namespace = _job_ref(job)
    child = names.ChildNames(job_name)
    urls = {}
    for env in job.spec.environments:
        url = f"http://{service_dns(child.environment(env.name), namespace, settings)}:{env.port}"
        urls[env.name] = url
        if env.nemo_gym is not None:
            urls.setdefault(env.nemo_gym.agent, url)
    return urls


def gcs_address(job: api.GRPOJob, settings: OperatorSettings) -> str:
    job_name, namespace = _job_ref(job)
    return f"{service_dns(names.ChildNames(job_name).head_service, namespace, settings)}:{endpoints.GCS_PORT}"


def endpoints_data(job: api.GRPOJob, settings: OperatorSettings, head_pod_ip: str, attempt: int) -> dict[str, str]:
    """The data of `<job>-endpoints` (`grpojob_api.endpoints.Endpoints`); every key is an environment variable."""
    job_name, namespace = _job_ref(job)
    child = names.ChildNames(job_name)
    head = service_dns(child.head_service, namespace, settings)
    generation = service_dns(child.generation_service, namespace, settings)
    return endpoints.Endpoints(
        ray_gcs_address=gcs_address(job, settings),
        ray_head_pod_ip=head_pod_ip,
        ray_dashboard_url=f"http://{head}:{endpoints.DASHBOARD_PORT}",
        policy_base_url=f"http://{generation}:{endpoints.GENERATION_PORT}/v1",
        environment_urls=environment_urls(job, settings),
        job_name=job_name,
        attempt=attempt,
    ).data()


def build_endpoints(job: api.GRPOJob, settings: OperatorSettings, head_pod_ip: str, attempt: int) -> Manifest:
    job_name, _ = _job_ref(job)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, names.ChildNames(job_name).endpoints, "endpoints"),
        "data": endpoints_data(job, settings, head_pod_ip, attempt),
    }


def build_progress(job: api.GRPOJob) -> Manifest:
    """The ConfigMap the trainer reports progress into (created empty by the operator, since a Role
    can grant `update` on one named object but not `create`)."""
    job_name, _ = _job_ref(job)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, names.ChildNames(job_name).progress, "progress"),
        "data": {},
    }


# ------------------------------------------------------------------------------------------------
# environments


def _env_vars(variables: list[api.EnvVar]) -> list[Manifest]:
    out = []
    for var in variables:
        if var.secret_key_ref is not None:
            ref = var.secret_key_ref
            out.append({"name": var.name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
        else:
            out.append({"name": var.name, "value": var.value})
    return out


def _endpoints_env_from(job: api.GRPOJob) -> list[Manifest]:
    job_name, _ = _job_ref(job)
    return [{"configMapRef": {"name": names.ChildNames(job_name).endpoints}}]


def _pod_attempt_env(attempt: int) -> Manifest:
    """The pod's own attempt: it refuses `<job>-endpoints` of an older one (`grpojob_trainer.rendezvous`)."""
    return {"name": endpoints.GRPOJOB_POD_ATTEMPT, "value": str(attempt)}


def _endpoints_volume(job: api.GRPOJob) -> tuple[Manifest, Manifest]:
    """`<job>-endpoints` as files too (volume, mount): the kubelet keeps them current, where a pod re-reads
    endpoints it refused."""
    job_name, _ = _job_ref(job)
    volume = {"name": "endpoints", "configMap": {"name": names.ChildNames(job_name).endpoints}}
    return volume, {"name": "endpoints", "mountPath": endpoints.ENDPOINTS_MOUNT, "readOnly": True}


def build_environment_deployment(
    job: api.GRPOJob, env: api.EnvironmentSpec, settings: OperatorSettings, attempt: int
) -> Manifest:
    """Deployment of one Penguin environment server, made during ``attempt``; it reads `<job>-endpoints`
    through envFrom (and refuses them if they are of an older attempt)."""
    job_name, _ = _job_ref(job)
    endpoints_volume, endpoints_mount = _endpoints_volume(job)
    selector = {names.JOB_LABEL: job_name, names.ENVIRONMENT_LABEL: env.name}
    labels = {**_labels(job, "environment"), **selector}
    container: Manifest = {
        "name": "environment",
        "image": env.image or job.spec.images.environment or settings.environment_image,
        "env": [
            {"name": endpoints.PORT, "value": str(env.port)},
            {"name": endpoints.POLICY_MODEL_NAME, "value": job.spec.model.served_model_name},
            _pod_attempt_env(attempt),
            *_env_vars(env.env),
        ],
        "envFrom": _endpoints_env_from(job),
        "ports": [{"name": "http", "containerPort": env.port}],
        "readinessProbe": {"httpGet": {"path": "/", "port": env.port}, "periodSeconds": 5},
        "resources": env.resources.model_dump(exclude_defaults=False),
        "securityContext": read_only_container_security_context(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, endpoints_mount],
    }
    if env.command:
        container["command"] = env.command
    if env.args:
        container["args"] = env.args
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(job, names.ChildNames(job_name).environment(env.name), "environment", selector),
        "spec": {
            "replicas": env.replicas,
            "selector": {"matchLabels": selector},
            "template": scheduled(
                {
                    "metadata": {"labels": labels},
                    "spec": {
                        "securityContext": pod_security_context(),
                        "automountServiceAccountToken": False,
                        "containers": [container],
                        "volumes": [{"name": "tmp", "emptyDir": {}}, endpoints_volume],
                    },
                },
                job.spec.scheduling.environments,
            ),
        },
    }


def build_nemo_gym_config_map(job: api.GRPOJob, env: api.EnvironmentSpec, endpoints: dict[str, str]) -> Manifest:
    """The NeMo Gym config of environment ``env`` (see `nemo_gym.render_config`), from the endpoints' data."""
    job_name, _ = _job_ref(job)
    selector = {names.JOB_LABEL: job_name, names.ENVIRONMENT_LABEL: env.name}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, names.ChildNames(job_name).nemo_gym_config(env.name), "environment", selector),
        "data": {nemo_gym.CONFIG_FILE: nemo_gym.config_yaml(nemo_gym.render_config(job, env, endpoints))},
    }


def build_nemo_gym_deployment(
    job: api.GRPOJob, env: api.EnvironmentSpec, settings: OperatorSettings, endpoint_data: dict[str, str], head_pod: str
) -> Manifest:
    """Deployment of a NeMo Gym environment: each pod joins the job's Ray cluster as a node without
    resources, then runs `ng_run` with the config of `build_nemo_gym_config_map`; the agent serves `/run`
    on the environment's port. The pod template carries a hash of the config and the Ray head, so a new
    head (or config) rolls the pods. Read-only root: Ray and NeMo Gym write to emptyDirs only."""
    job_name, _ = _job_ref(job)
    child = names.ChildNames(job_name)
    selector = {names.JOB_LABEL: job_name, names.ENVIRONMENT_LABEL: env.name}
    config_text = nemo_gym.config_yaml(nemo_gym.render_config(job, env, endpoint_data))
    endpoints_volume, endpoints_mount = _endpoints_volume(job)
    container: Manifest = {
        "name": "nemo-gym",
        "image": env.image or settings.nemo_gym_image,
        "command": nemo_gym.COMMAND,
        "workingDir": nemo_gym.WORK_DIR,
        "env": [
            *ray_auth_env(job),
            {"name": "HOME", "value": nemo_gym.WORK_DIR},
            {"name": endpoints.PORT, "value": str(env.port)},
            {"name": endpoints.POLICY_MODEL_NAME, "value": job.spec.model.served_model_name},
            # The attempt of the endpoints the config was rendered from: a new head rolls the pods.
            _pod_attempt_env(int(endpoint_data[endpoints.GRPOJOB_ATTEMPT])),
            *_env_vars(env.env),
        ],
        "envFrom": _endpoints_env_from(job),
        "ports": [{"name": "http", "containerPort": env.port}],
        "readinessProbe": {"httpGet": {"path": "/", "port": env.port}, "periodSeconds": 5},
        "resources": env.resources.model_dump(exclude_defaults=False),
        "securityContext": read_only_container_security_context(),
        "volumeMounts": [
            {"name": "config", "mountPath": nemo_gym.CONFIG_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": nemo_gym.WORK_DIR},
            {"name": "shm", "mountPath": "/dev/shm"},
            endpoints_mount,
        ],
    }
    annotations = {names.NEMO_GYM_CONFIG_HASH_ANNOTATION: nemo_gym.config_hash(config_text, endpoint_data, head_pod)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(job, child.environment(env.name), "environment", selector),
        "spec": {
            "replicas": env.replicas,
            "selector": {"matchLabels": selector},
            "template": scheduled(
                {
                    "metadata": {"labels": {**_labels(job, "environment"), **selector}, "annotations": annotations},
                    "spec": {
                        "securityContext": pod_security_context(),
                        "automountServiceAccountToken": False,
                        "containers": [container],
                        "volumes": [
                            {"name": "config", "configMap": {"name": child.nemo_gym_config(env.name)}},
                            {"name": "tmp", "emptyDir": {}},
                            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": nemo_gym.SHM_SIZE}},
                            endpoints_volume,
                        ],
                    },
                },
                job.spec.scheduling.environments,
            ),
        },
    }


def build_environment_service(job: api.GRPOJob, env: api.EnvironmentSpec) -> Manifest:
    job_name, _ = _job_ref(job)
    selector = {names.JOB_LABEL: job_name, names.ENVIRONMENT_LABEL: env.name}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, names.ChildNames(job_name).environment(env.name), "environment", selector),
        "spec": {"selector": selector, "ports": [{"name": "http", "port": env.port, "targetPort": env.port}]},
    }


# ------------------------------------------------------------------------------------------------
# trainer


def build_trainer_rbac(job: api.GRPOJob) -> list[Manifest]:
    """ServiceAccount, Role and RoleBinding of the trainer: it may read and update its own progress
    ConfigMap, and nothing else."""
    job_name, _ = _job_ref(job)
    child = names.ChildNames(job_name)
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _metadata(job, child.trainer, "trainer"),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _metadata(job, child.trainer, "trainer"),
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": [child.progress],
                    "verbs": ["get", "update", "patch"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _metadata(job, child.trainer, "trainer"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": child.trainer},
            "subjects": [{"kind": "ServiceAccount", "name": child.trainer}],
        },
    ]


def _dataset_volume(job: api.GRPOJob) -> tuple[list[Manifest], list[Manifest], str]:
    dataset = job.spec.dataset
    if dataset.config_map is not None:
        volume = {"name": "dataset", "configMap": {"name": dataset.config_map.name}}
        mount = {"name": "dataset", "mountPath": DATASET_MOUNT, "readOnly": True}
        return [volume], [mount], f"{DATASET_MOUNT}/{dataset.config_map.key}"
    if dataset.pvc is not None:
        mount = {"name": "dataset", "mountPath": DATASET_MOUNT, "readOnly": True}
        if dataset.pvc.path:
            mount["subPath"] = dataset.pvc.path
        return [_pvc_volume("dataset", dataset.pvc, read_only=True)], [mount], f"{DATASET_MOUNT}/{dataset.path}"
    return [], [], str(dataset.path)


def build_trainer_job(
    job: api.GRPOJob, settings: OperatorSettings, attempt: int, model_commit: str | None = None
) -> Manifest:
    """The trainer Job of one attempt: joins the Ray cluster at `RAY_GCS_ADDRESS` (from the endpoints
    ConfigMap) and runs the GRPO loop. The Job itself never retries: the operator counts attempts. A hub
    model (`spec.model.id`) is loaded at ``model_commit``, the commit its download resolved."""
    job_name, _ = _job_ref(job)
    child = names.ChildNames(job_name)
    attempt_label = {names.ATTEMPT_LABEL: str(attempt)}
    model_volumes, model_mounts = _model_volumes(job)
    dataset_volumes, dataset_mounts, dataset_path = _dataset_volume(job)
    _, _, checkpoint_dir = checkpoint_volume(job)
    _, _, output_dir = output_volume(job)
    log_volumes, log_mounts, log_dir = log_volume(job, read_only=False)
    endpoints_volume, endpoints_mount = _endpoints_volume(job)
    volumes = [
        {"name": "config", "configMap": {"name": child.config}},
        endpoints_volume,
        {"name": "tmp", "emptyDir": {}},
        *model_volumes,
        *dataset_volumes,
        *log_volumes,
    ]
    mounts = [
        {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
        endpoints_mount,
        {"name": "tmp", "mountPath": "/tmp"},
        *model_mounts,
        *dataset_mounts,
        *log_mounts,
    ]
    volumes, mounts = share_claims(volumes, mounts)
    return _run_once_job(
        job,
        _metadata(job, child.trainer, "trainer", attempt_label),
        {**_labels(job, "trainer"), **attempt_label},
        {
            "serviceAccountName": child.trainer,
            "securityContext": pod_security_context(),
            "volumes": volumes,
            "containers": [
                {
                    "name": "trainer",
                    "image": job.spec.images.trainer or settings.default_trainer_image(),
                    "command": ["grpojob", "train", "--config", f"{CONFIG_MOUNT}/{CONFIG_FILE}"],
                    "envFrom": [*_endpoints_env_from(job), *tracking_env_from(job)],
                    "env": [
                        *ray_auth_env(job),
                        *hub_env(job),
                        _pod_attempt_env(attempt),
                        *endpoints.TrainerEnv(
                            progress_config_map=child.progress,
                            model_path=model_path(job, model_commit),
                            dataset_path=dataset_path,
                            checkpoint_dir=checkpoint_dir,
                            output_dir=output_dir,
                            log_dir=attempt_log_dir(log_dir, attempt),
                            metrics_port=endpoints.TRAINER_METRICS_PORT,
                        ).env(),
                        {
                            "name": endpoints.POD_NAMESPACE,
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                        },
                        *tracking_env(job),
                    ],
                    "ports": [{"name": "metrics", "containerPort": endpoints.TRAINER_METRICS_PORT}],
                    "resources": {
                        "requests": {"cpu": "2", "memory": "8Gi"},
                        "limits": {"memory": "8Gi"},
                    },
                    "volumeMounts": mounts,
                    "securityContext": read_only_container_security_context(),
                }
            ],
        },
    )


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


# ------------------------------------------------------------------------------------------------
# TensorBoard


def _tensorboard_selector(job: api.GRPOJob) -> dict[str, str]:
    job_name, _ = _job_ref(job)
    return {names.JOB_LABEL: job_name, names.COMPONENT_LABEL: "tensorboard"}


def build_tensorboard_deployment(job: api.GRPOJob, settings: OperatorSettings) -> Manifest:
    """TensorBoard over the job's log directory (every attempt's run), on the log claim mounted read-only,
    from the trainer image (which has TensorBoard)."""
    job_name, _ = _job_ref(job)
    volumes, mounts, log_dir = log_volume(job, read_only=True)
    selector = _tensorboard_selector(job)
    port = endpoints.TENSORBOARD_PORT
    container: Manifest = {
        "name": "tensorboard",
        "image": job.spec.images.trainer or settings.default_trainer_image(),
        "command": ["tensorboard", f"--logdir={log_dir}", "--host=0.0.0.0", f"--port={port}"],
        "ports": [{"name": "http", "containerPort": port}],
        "readinessProbe": {"httpGet": {"path": "/", "port": port}, "periodSeconds": 5},
        "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        "securityContext": {**container_security_context(), "readOnlyRootFilesystem": True},
        "volumeMounts": [*mounts, {"name": "tmp", "mountPath": "/tmp"}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(job, names.ChildNames(job_name).tensorboard, "tensorboard"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": {**_labels(job, "tensorboard"), **selector}},
                "spec": {
                    "securityContext": pod_security_context(),
                    "automountServiceAccountToken": False,
                    "containers": [container],
                    "volumes": [*volumes, {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


def build_tensorboard_service(job: api.GRPOJob) -> Manifest:
    """`<job>-tensorboard`: `kubectl port-forward svc/<job>-tensorboard 6006`."""
    job_name, _ = _job_ref(job)
    port = endpoints.TENSORBOARD_PORT
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, names.ChildNames(job_name).tensorboard, "tensorboard"),
        "spec": {
            "selector": _tensorboard_selector(job),
            "ports": [{"name": "http", "port": port, "targetPort": port}],
        },
    }
