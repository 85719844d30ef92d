"""The job's Ray workers (policy ranks, generation engines), watched for their loss, and waited for on a retry.

`WorkerWatch` keeps one cheap call (`__ray_ready__`) queued on every actor: it answers when the actor is idle
(and is queued again a second later) and fails as soon as Ray declares the actor dead, which wakes the watch
within seconds of a worker's pod being deleted, its node reclaimed or its process crashing, whatever the loop
is waiting for at the time. It then tells a lost node from a crash: a worker whose node left the Ray cluster
(its pod deleted, its machine reclaimed: a preemption) is `LostWorker.node_gone`; a worker that died while its
node stayed (out of memory, a crash) is not. The GCS may mark the node dead some time after the actor (its health
checks give up on a vanished node within about a minute), so the watch waits up to ``node_grace_s`` for that
before calling it a crash.

`wait_for_workers` is the other half: a retry's trainer, joined to a cluster whose lost worker pod is being
replaced (Pending until a node comes), waits for the cluster's resources to come back, saying what it waits
for, rather than failing at once.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Place:
    """Where a worker runs: its Ray node, the node's address and the host (on Kubernetes, the pod's name)."""

    node_id: str
    node_ip: str
    host: str
    in_a_pod: bool

    def __str__(self) -> str:
        return f"{'pod' if self.in_a_pod else 'host'} {self.host}, node {self.node_ip}"


def _place_of(_actor: object) -> Place:
    """Run inside an actor (``__ray_call__``): where it runs."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    pod = "KUBERNETES_SERVICE_HOST" in os.environ
    return Place(node, ray.util.get_node_ip_address(), socket.gethostname(), pod)


@dataclass(frozen=True)
class WorkerName:
    """A worker by its part in the job: ``policy`` rank or ``generation`` engine ``index``."""

    role: str
    index: int


POLICY, GENERATION = "policy", "generation"


@dataclass(frozen=True)
class LostWorker:
    """A worker Ray declared dead, where it ran, and whether its node left the cluster with it."""

    name: WorkerName
    place: Place | None
    node_gone: bool
    cause: str
    """Ray's word on the death, its first line."""

    @property
    def policy(self) -> bool:
        return self.name.role == POLICY

    def where(self) -> str:
        """``pod P, node IP`` (``host H`` outside Kubernetes; what Ray said when the worker's place is unknown)."""
        return self.cause if self.place is None else str(self.place)

    def what_happened(self) -> str:
        return "its node left the Ray cluster" if self.node_gone else f"its process died ({self.cause})"

    @classmethod
    def from_error(cls, error: BaseException) -> LostWorker:
        """A worker known only by the error of a call to it (the watch had not placed it)."""
        return cls(WorkerName("Ray", 0), None, False, _first_line(error))


def _first_line(error: BaseException) -> str:
    """Ray's reason for an actor's death, without its list of common causes."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("The actor is dead") or "node" in line.lower()]
    return (said or lines or [type(error).__name__])[0].partition(" Some common causes")[0][:300]


class WorkerWatch:
    """Watch ``workers`` (name → actor handle) from a daemon thread; call ``on_lost`` once, with the first
    worker lost. ``start`` asks each worker where it runs (within ``timeout_s``)."""

    def __init__(
        self,
        workers: Mapping[WorkerName, Any],
        on_lost: Callable[[LostWorker], None],
        *,
        interval_s: float = 1.0,
        node_grace_s: float = 60.0,
    ) -> None:
        self.workers = dict(workers)
        self.on_lost = on_lost
        self.interval_s, self.node_grace_s = interval_s, node_grace_s
        self.places: dict[WorkerName, Place] = {}
        self.lost: LostWorker | None = None
        self.deciding = False
        """Whether a worker's call failed and the watch waits for the GCS's word on its node."""
        self._answered: dict[WorkerName, float] = {}
        """When the newest call each worker answered was made."""
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 60.0) -> WorkerWatch:
        import ray

        names = list(self.workers)
        found = ray.get([self.workers[name].__ray_call__.remote(_place_of) for name in names], timeout=timeout_s)
        self.places = dict(zip(names, found, strict=True))
        self._thread = threading.Thread(target=self._watch, name="ray-worker-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def answered_since(self, since: float) -> bool:
        """Whether every worker answered a call made at or after ``since`` (`time.monotonic`): each was alive
        then."""
        return all(self._answered.get(name, -math.inf) >= since for name in self.workers)

    def _watch(self) -> None:
        import ray
        from ray.exceptions import RayActorError

        pings: dict[Any, tuple[WorkerName, float]] = {}
        due: dict[WorkerName, float] = dict.fromkeys(self.workers, 0.0)
        try:
            while not self._stopped.is_set():
                now = time.monotonic()
                for name in [name for name, when in due.items() if when <= now]:
                    pings[self.workers[name].__ray_ready__.remote()] = (name, now)
                    del due[name]
                ready, _ = ray.wait(list(pings), num_returns=1, timeout=self.interval_s)
                for ref in ready:
                    name, sent = pings.pop(ref)
                    try:
                        ray.get(ref)
                    except RayActorError as error:
                        self.deciding = True
                        self._report(self._lost(name, error))
                        return
                    self._answered[name] = sent
                    due[name] = time.monotonic() + self.interval_s
        except Exception as error:  # Ray is shutting down, or the GCS went away (the head's watch reports that)
            log.debug("the worker watch ends: %s", error)

    def _report(self, lost: LostWorker) -> None:
        if self._stopped.is_set():
            return  # the run is ending, and its workers with it
        self.lost = lost
        name = lost.name
        log.error("lost the %s worker %d (%s): %s", name.role, name.index, lost.where(), lost.what_happened())
        self.on_lost(lost)

    def _lost(self, name: WorkerName, error: BaseException) -> LostWorker:
        """The loss of ``name``: its node gone or not; a policy rank on the same node is named before an engine
        (when a pod of both goes, the policy's state is what is lost)."""
        place = self.places.get(name)
        gone = place is not None and self._node_gone(place.node_id)
        if gone and place is not None and name.role != POLICY:
            on_node = [other for other, at in self.places.items() if at.node_id == place.node_id]
            beside = [other for other in on_node if other.role == POLICY]
            name = beside[0] if beside else name
        return LostWorker(name, place, gone, _first_line(error))

    def _node_gone(self, node_id: str) -> bool:
        """Whether the GCS marks ``node_id`` dead within ``node_grace_s`` (never for the driver's own node)."""
        import ray

        if node_id == ray.get_runtime_context().get_node_id():
            return False
        deadline = time.monotonic() + self.node_grace_s
        while True:
            try:
                alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
            except Exception:  # the GCS itself is unreachable: the head's watch reports that
                return False
            if node_id not in alive:
                return True
            if time.monotonic() >= deadline or self._stopped.is_set():
                return False
            time.sleep(1.0)


def missing_resources(needed: Mapping[str, float], present: Mapping[str, float]) -> dict[str, tuple[float, float]]:
    """Each resource of ``needed`` that ``present`` (the cluster's totals) lacks: (present, needed)."""
    return {name: (present.get(name, 0.0), want) for name, want in needed.items() if present.get(name, 0.0) < want}


def describe_missing(missing: Mapping[str, tuple[float, float]]) -> str:
    return ", ".join(f"{name} {have:g} of {want:g}" for name, (have, want) in sorted(missing.items()))


def wait_for_workers(
    needed: Mapping[str, float],
    timeout_s: float,
    *,
    poll_s: float = 5.0,
    say_every_s: float = 60.0,
    cluster_resources: Callable[[], Mapping[str, float]] | None = None,
) -> None:
    """Wait until the Ray cluster's alive nodes offer ``needed`` (the worker groups' custom resources, their
    GPUs), saying what is missing when it starts waiting and every ``say_every_s``; `TimeoutError` naming what
    is still missing after ``timeout_s``."""
    if cluster_resources is None:
        import ray

        cluster_resources = ray.cluster_resources
    started = time.monotonic()
    said = None
    while missing := missing_resources(needed, cluster_resources()):
        waited = time.monotonic() - started
        if waited >= timeout_s:
            raise TimeoutError(
                f"the Ray cluster's worker pods did not come back within {timeout_s:.0f}s: {describe_missing(missing)}"
            )
        if said is None or waited - said >= say_every_s:
            said = waited
            log.info(
                "waiting for the Ray cluster's worker pods (one is starting, or its node is being replaced): "
                "%s; up to %.0fs",
                describe_missing(missing),
                timeout_s - waited,
            )
        time.sleep(poll_s)
    if said is not None:
        log.info("the Ray cluster's worker pods are back after %.0fs", time.monotonic() - started)
