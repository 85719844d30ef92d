"""`<job>-endpoints`: the ConfigMap the operator writes once the Ray head is up (the Ray cluster's, the
generation Service's and every environment's address, and the attempt they belong to), and how a pod reads
it (as environment variables, and as files the kubelet keeps current)."""

from __future__ import annotations

from grpojob_api import endpoints, nemo_gym
from grpojob_api import v1alpha1 as api
from grpojob_operator import names
from grpojob_operator.children.meta import Manifest, job_ref, metadata, service_dns
from grpojob_operator.settings import OperatorSettings


def environment_urls(job: api.GRPOJob, settings: OperatorSettings) -> dict[str, str]:
    """Base URL of each environment's Service, by environment name; a NeMo Gym environment's URL also
    under its agent's name, which NeMo Gym's dataset rows carry in `agent_ref.name`."""
    job_name, namespace = job_ref(job)
    child = names.ChildNames(job_name)
    urls = {
        env.name: f"http://{service_dns(child.environment(env.name), namespace, settings)}:{env.port}"
        for env in job.spec.environments
    }
    return nemo_gym.with_agent_names(job.spec.environments, urls)


def gcs_address(job: api.GRPOJob, settings: OperatorSettings) -> str:
    """The Ray cluster's GCS, through the head's Service."""
    job_name, namespace = job_ref(job)
    return f"{service_dns(names.ChildNames(job_name).head_service, namespace, settings)}:{endpoints.GCS_PORT}"


def endpoints_data(job: api.GRPOJob, settings: OperatorSettings, head_pod_ip: str, attempt: int) -> dict[str, str]:
    """The data of `<job>-endpoints` (`grpojob_api.endpoints.Endpoints`); every key is an environment variable."""
    job_name, namespace = job_ref(job)
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
    """`<job>-endpoints` of ``attempt``, whose Ray head pod has ``head_pod_ip``."""
    job_name, _ = job_ref(job)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(job, names.ChildNames(job_name).endpoints, "endpoints"),
        "data": endpoints_data(job, settings, head_pod_ip, attempt),
    }


def endpoints_env_from(job: api.GRPOJob) -> list[Manifest]:
    """`<job>-endpoints` as a container's environment variables."""
    job_name, _ = job_ref(job)
    return [{"configMapRef": {"name": names.ChildNames(job_name).endpoints}}]


def endpoints_volume(job: api.GRPOJob) -> tuple[Manifest, Manifest]:
    """`<job>-endpoints` as files too (volume, mount): the kubelet keeps them current, where a pod re-reads
    endpoints it refused."""
    job_name, _ = job_ref(job)
    volume = {"name": "endpoints", "configMap": {"name": names.ChildNames(job_name).endpoints}}
    return volume, {"name": "endpoints", "mountPath": endpoints.ENDPOINTS_MOUNT, "readOnly": True}


def pod_attempt_env(attempt: int) -> Manifest:
    """The pod's own attempt: it refuses `<job>-endpoints` of an older one
    (`grpojob_trainer.cluster.rendezvous`)."""
    return {"name": endpoints.GRPOJOB_POD_ATTEMPT, "value": str(attempt)}
