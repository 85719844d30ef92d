"""Connecting the trainer to Ray: a local head for `grpojob run`, or the job's RayCluster on Kubernetes.

On Kubernetes the trainer pod is outside the RayCluster. A Ray driver needs a raylet on its own node,
so the pod joins the cluster as a node with no resources at `RAY_GCS_ADDRESS` (from the
`<job>-endpoints` ConfigMap) and attaches to it; nothing is scheduled on it. Either way the address is
read back from the runtime context, which proves Ray is initialised and is what the environment
servers' config receives (as NeMo-RL does for NeMo Gym's `ray_head_node_address`). Both clusters require a
token (Ray's token authentication): the job's on Kubernetes, one of the run's own locally.
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
import threading
from typing import Any, NoReturn

from grpojob_api import endpoints
from grpojob_trainer.errors import RayHeadLost

log = logging.getLogger(__name__)


def start_local(ray_resources: dict[str, int], num_gpus: int = 0) -> str:
    """Start a local Ray head declaring the custom resources of the RayCluster's worker groups
    (`grpojob_api.placement.Layout.ray_resources`) and this machine's GPUs; its GCS address.

    Ray's servers listen on every address of the machine (Ray has no setting that binds its GCS to
    loopback), so the head requires a token of this run, as the job's RayCluster requires the job's: a
    client without it is refused. The token reaches Ray's processes and the environment servers through
    this process's environment; it is never written to a file (Ray's default is ~/.ray/auth_token)."""
    ask_for_token_auth()
    import ray

    os.environ[endpoints.RAY_AUTH_TOKEN] = secrets.token_hex(32)
    # The workers' own progress bars (transformers loading weights) would be printed through the run's.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    ray.init(
        num_cpus=os.cpu_count() or 1,
        num_gpus=num_gpus,
        resources=ray_resources,
        include_dashboard=False,
        namespace="grpojob",
        logging_level=logging.WARNING,
    )
    return gcs_address()


def ask_for_token_auth() -> None:
    """Ask Ray for token authentication by name (`RAY_AUTH_MODE=token`) before the local head starts.

    Ray reads the mode once, when it is imported. Set before that, Ray starts the head with token authentication
    and says nothing. Where Ray was imported first (its mode read as unset or another), the mode is left unset:
    `ray.init` then turns token authentication on for the cluster it starts by itself, with a warning that
    offers to turn it off."""
    if "ray" in sys.modules and os.environ.get(endpoints.RAY_AUTH_MODE) != endpoints.RAY_AUTH_MODE_TOKEN:
        os.environ.pop(endpoints.RAY_AUTH_MODE, None)
    else:
        os.environ[endpoints.RAY_AUTH_MODE] = endpoints.RAY_AUTH_MODE_TOKEN


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


def disconnect(head: HeadWatch | None = None) -> None:
    """Disconnect the driver (a joined pod's raylet ends with the pod), unless ``head`` saw the head
    lost: then Ray's teardown would only wait on the dead GCS, and `exit_without_ray` ends the process."""
    import ray

    if head is None or not head.lost:
        ray.shutdown()


def exit_without_ray(code: int) -> NoReturn:
    """End the process now, skipping Ray's teardown. With the GCS gone, ``ray.shutdown`` and the core
    worker's destructor wait on it until Ray's own fatal exit a minute later (code 1, and a message
    about the GCS instead of ours)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


HEAD_NODE_RESOURCE = "node:__internal_head__"
"""The resource Ray gives the head node only."""


class HeadWatch:
    """The Ray head this driver is attached to, checked between steps.

    Actors talk to each other directly, so a trainer whose head pod was killed keeps stepping until Ray's
    processes give up on the GCS (a minute by default), or joins the new head's GCS with none of the old
    cluster's state. ``check`` asks the GCS for its nodes: no answer within ``timeout_s``, an error, or a
    node list without the head seen at start all raise ``RayHeadLost``, so the step loop stops at a step
    boundary and the attempt fails with the reason.
    """

    def __init__(self, timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self.lost = False
        heads = [node["NodeID"] for node in self._alive_nodes() if HEAD_NODE_RESOURCE in node["Resources"]]
        if len(heads) != 1:
            raise RayHeadLost(f"expected one Ray head node, the GCS lists {len(heads)}")
        self.head_node_id: str = heads[0]

    def check(self) -> None:
        """Raise ``RayHeadLost`` unless the head seen at start is still the cluster's live head."""
        try:
            if not any(node["NodeID"] == self.head_node_id for node in self._alive_nodes()):
                raise RayHeadLost(
                    f"the Ray head node {self.head_node_id[:12]} is gone from the cluster (its pod was replaced)"
                )
        except RayHeadLost:
            self.lost = True
            raise

    def _alive_nodes(self) -> list[dict[str, Any]]:
        import ray

        answer: dict[str, Any] = {}

        def ask() -> None:
            try:
                answer["nodes"] = ray.nodes()
            except Exception as error:  # whatever the GCS client raises, the head is not usable
                answer["error"] = error

        # A daemon thread: a GCS that is gone never answers, and nothing must wait for it at exit.
        asking = threading.Thread(target=ask, name="ray-head-check", daemon=True)
        asking.start()
        asking.join(self.timeout_s)
        if "error" in answer:
            raise RayHeadLost(f"the Ray GCS answered with an error: {answer['error']}")
        if "nodes" not in answer:
            raise RayHeadLost(f"the Ray GCS did not answer within {self.timeout_s:.0f}s (the head pod is gone)")
        return [node for node in answer["nodes"] if node["Alive"]]


def gcs_address() -> str:
    """The GCS address of the Ray cluster this process is connected to, read from the runtime context."""
    import ray

    if not ray.is_initialized():
        raise RuntimeError("Ray is not initialised: connect with start_local() or join() first")
    address = ray.get_runtime_context().gcs_address
    if not address:
        raise RuntimeError("Ray is initialised but its runtime context has no GCS address")
    return address
