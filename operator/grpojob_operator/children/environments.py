"""An environment's servers: a Deployment of `replicas` pods, each reading `<job>-endpoints`, and the Service
the trainer sends rollouts to. A NeMo Gym environment's pods are built by `nemo_gym` on the same Deployment."""

from __future__ import annotations

from typing import Any

from grpojob_api import endpoints, rewards
from grpojob_api import v1alpha1 as api
from grpojob_operator import names
from grpojob_operator.children import pod
from grpojob_operator.children.endpoints import endpoints_env_from, endpoints_volume, pod_attempt_env
from grpojob_operator.children.meta import Manifest, job_ref, labels, metadata
from grpojob_operator.settings import OperatorSettings


def env_vars(variables: list[api.EnvVar]) -> list[Manifest]:
    """The environment variables of `spec.environments[].env`, as a container's."""
    out = []
    for var in variables:
        if var.secret_key_ref is not None:
            ref = var.secret_key_ref
            out.append({"name": var.name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
        else:
            out.append({"name": var.name, "value": var.value})
    return out


def environment_selector(job: api.GRPOJob, env: api.EnvironmentSpec) -> dict[str, str]:
    """The labels that select one environment's pods."""
    job_name, _ = job_ref(job)
    return {names.JOB_LABEL: job_name, names.ENVIRONMENT_LABEL: env.name}


def environment_deployment(
    job: api.GRPOJob,
    env: api.EnvironmentSpec,
    attempt: int,
    server: Manifest,
    volumes: list[Manifest],
    mounts: list[Manifest],
    annotations: dict[str, str] | None = None,
) -> Manifest:
    """The Deployment of environment ``env``, made during ``attempt``, whose container is ``server`` (its name,
    image, command and leading environment variables) and whose pods mount ``volumes`` at ``mounts``. Every
    environment's container reads `<job>-endpoints` (refusing those of an older attempt), listens on the
    environment's port and is ready once it answers there; ``env.env`` comes last."""
    job_name, _ = job_ref(job)
    endpoints_vol, endpoints_mount = endpoints_volume(job)
    selector = environment_selector(job, env)
    fields: dict[str, Any] = {key: value for key, value in server.items() if key not in ("name", "image", "env")}
    container = pod.container(
        server["name"],
        server["image"],
        **fields,
        env=[
            *server.get("env", []),
            {"name": endpoints.PORT, "value": str(env.port)},
            {"name": endpoints.POLICY_MODEL_NAME, "value": job.spec.model.served_model_name},
            pod_attempt_env(attempt),
            *env_vars(env.env),
        ],
        envFrom=endpoints_env_from(job),
        ports=[{"name": "http", "containerPort": env.port}],
        readinessProbe={"httpGet": {"path": "/", "port": env.port}, "periodSeconds": 5},
        resources=env.resources.model_dump(exclude_defaults=False),
        volumeMounts=[*mounts, endpoints_mount],
    )
    template = pod.hardened_pod(
        {**labels(job, "environment"), **selector},
        [container],
        [*volumes, endpoints_vol],
        job.spec.scheduling.environments,
        annotations=annotations,
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(job, names.ChildNames(job_name).environment(env.name), "environment", selector),
        "spec": {"replicas": env.replicas, "selector": {"matchLabels": selector}, "template": template},
    }


def build_environment_deployment(
    job: api.GRPOJob, env: api.EnvironmentSpec, settings: OperatorSettings, attempt: int
) -> Manifest:
    """Deployment of one environment server (the image's own, `env.command`, or the reward server of
    `env.rewards`), made during ``attempt``."""
    server: Manifest = {
        "name": "environment",
        "image": env.image or job.spec.images.environment or settings.environment_image,
    }
    if env.command:
        server["command"] = env.command
    if env.args:
        server["args"] = env.args
    volumes, mounts = [{"name": "tmp", "emptyDir": {}}], [{"name": "tmp", "mountPath": "/tmp"}]
    if env.rewards is not None:
        server["command"] = list(rewards.SERVER_COMMAND)
        server["env"] = [
            {"name": name, "value": value}
            for name, value in rewards.server_env(env.rewards, rewards.pod_file(env.rewards)).items()
        ]
        volumes, mounts = [*volumes, *reward_file_volumes(env.rewards)], [*mounts, *reward_file_mounts(env.rewards)]
    return environment_deployment(job, env, attempt, server, volumes, mounts)


REWARD_FILE_VOLUME = "reward-file"


def reward_file_volumes(spec: api.RewardsSpec) -> list[Manifest]:
    """The volume holding the reward file: its ConfigMap (only its key), or its claim; none for a file in the
    image. The user's code is mounted only here, in the environment's pods."""
    if spec.config_map is not None:
        items = [{"key": spec.config_map_key, "path": spec.config_map_key}]
        return [{"name": REWARD_FILE_VOLUME, "configMap": {"name": spec.config_map.name, "items": items}}]
    if spec.pvc is not None:
        return [
            {"name": REWARD_FILE_VOLUME, "persistentVolumeClaim": {"claimName": spec.pvc.claim_name, "readOnly": True}}
        ]
    return []


def reward_file_mounts(spec: api.RewardsSpec) -> list[Manifest]:
    """Where the reward file's volume is mounted: read-only, at `/etc/grpojob-rewards` (a claim at its `claim`)."""
    if spec.config_map is not None:
        return [{"name": REWARD_FILE_VOLUME, "mountPath": rewards.MOUNT_DIR, "readOnly": True}]
    if spec.pvc is not None:
        mount = {"name": REWARD_FILE_VOLUME, "mountPath": rewards.CLAIM_MOUNT, "readOnly": True}
        return [mount | ({"subPath": spec.pvc.path} if spec.pvc.path else {})]
    return []


def build_environment_service(job: api.GRPOJob, env: api.EnvironmentSpec) -> Manifest:
    """The headless Service over one environment's ready pods, on its port: its name resolves to their
    addresses, and the trainer spreads rollouts over them (`grpojob_trainer.experience.replicas.resolve_replicas`). No
    cluster IP: allocating one was the API server's slowest create in a burst of jobs (at 1,000 jobs it
    timed out 340 of their Service creates after 60 s), and a virtual IP would hide the replicas from the
    trainer. KubeRay's head Service and our generation Service are headless too."""
    job_name, _ = job_ref(job)
    selector = environment_selector(job, env)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(job, names.ChildNames(job_name).environment(env.name), "environment", selector),
        "spec": {
            "clusterIP": "None",
            "selector": selector,
            "ports": [{"name": "http", "port": env.port, "targetPort": env.port}],
            "publishNotReadyAddresses": False,
        },
    }
