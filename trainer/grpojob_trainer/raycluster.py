"""Connecting the trainer to Ray: a local head for `grpojob run`, or the job's RayCluster on Kubernetes.

On Kubernetes the trainer pod is outside the RayCluster. A Ray driver needs a raylet on its own node,
so the pod joins the cluster as a node with no resources at `RAY_GCS_ADDRESS` (from the
`<job>-endpoints` ConfigMap) and attaches to it; nothing is scheduled on it. Either way the address is
read back from the runtime context, which proves Ray is initialised and is what the environment
servers' config receives (as NeMo-RL does for Penguin's `ray_head_node_address`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from grpojob_api import endpoints
from grpojob_trainer.policy_group import PolicyGroup
from grpojob_trainer.workers import GenerationWorker, PolicyWorker

log = logging.getLogger(__name__)


def start_local(generation_replicas: int, policy_replicas: int, num_gpus: int = 0) -> str:
    """Start a local Ray head declaring the resources of the RayCluster's worker groups (and this
    machine's GPUs); its GCS address."""
    import ray

    ray.init(
        num_cpus=os.cpu_count() or 1,
        num_gpus=num_gpus,
        resources={endpoints.GENERATION_GROUP: generation_replicas, endpoints.POLICY_GROUP: policy_replicas},
        include_dashboard=False,
        namespace="grpojob",
        logging_level=logging.WARNING,
    )
    return gcs_address()


def join(address: str, timeout_s: float = 300.0) -> str:
    """Join the Ray cluster at ``address`` as a zero-resource node and attach the driver to it."""
    import ray

    command = [sys.executable, "-m", "ray.scripts.scripts", "start", f"--address={address}", "--num-cpus=0"]
    command += ["--num-gpus=0", "--disable-usage-stats"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"could not join the Ray cluster at {address}: no answer within {timeout_s:.0f}s") from None
    if result.returncode != 0:
        raise RuntimeError(f"could not join the Ray cluster at {address}: {result.stderr.strip()[-2000:]}")
    ray.init(address=address, namespace="grpojob", logging_level=logging.WARNING)
    return gcs_address()


def disconnect() -> None:
    """Disconnect the driver (a joined pod's raylet ends with the pod)."""
    import ray

    ray.shutdown()


def gcs_address() -> str:
    """The GCS address of the Ray cluster this process is connected to, read from the runtime context."""
    import ray

    if not ray.is_initialized():
        raise RuntimeError("Ray is not initialised: connect with start_local() or join() first")
    address = ray.get_runtime_context().gcs_address
    if not address:
        raise RuntimeError("Ray is initialised but its runtime context has no GCS address")
    return address


def place_generation(
    replicas: int, gpus: int, spec: dict, model_path: str, host: str, port: int | None, seed: int
) -> list:
    """One generation engine per `generation` worker (each needs the group's custom resource, and its
    GPUs: Ray hides GPUs from an actor that did not ask for them)."""
    import ray

    actor = ray.remote(GenerationWorker).options(num_cpus=0, num_gpus=gpus, resources={endpoints.GENERATION_GROUP: 1})
    return [actor.remote(spec, model_path, host, port, seed + i) for i in range(replicas)]


def place_policy(
    world: int, gpus: float, spec: dict, model_path: str, seed: int, timeout_s: float | None = None
) -> PolicyGroup:
    """The policy's ``world`` ranks, each on a `policy` worker (one unit of its resource) with ``gpus`` GPUs
    (1, a share of one, or 0 on the CPU), started; returns when all have loaded the model (or raises
    ``GetTimeoutError`` after ``timeout_s``)."""
    import ray

    actor = ray.remote(PolicyWorker).options(num_cpus=0, num_gpus=gpus, resources={endpoints.POLICY_GROUP: 1})
    ranks = [actor.remote(spec, model_path, seed, rank, world) for rank in range(world)]
    return PolicyGroup.start(ranks, timeout_s=timeout_s)
