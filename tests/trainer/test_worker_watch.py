"""The trainer's watch over its Ray workers, on a real Ray cluster of two nodes on this machine (a head, and a
worker node standing for a worker pod): a worker whose node leaves the cluster is lost with it (a pod deleted, a
spot machine reclaimed); a worker whose process dies on a node that stays died on its own; either is reported
within seconds, while its calls are still queued. A retry waits, saying so, for the cluster's resources to come
back."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from grpojob_trainer.cluster.workers import GENERATION, POLICY, LostWorker, WorkerName, WorkerWatch, wait_for_workers
from grpojob_trainer.training.stop import StopRequest

pytestmark = pytest.mark.timeout(300)


class Worker:
    """A Ray actor that works when asked (a stand-in for a rank or an engine: the watch needs no more)."""

    def pid(self) -> int:
        return os.getpid()

    def work(self, seconds: float) -> None:
        time.sleep(seconds)


@pytest.fixture
def cluster(own_ray_token: str) -> Iterator:
    """A head (where the driver runs and the engine goes) and one worker node offering the `policy` resource."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "resources": {"generation": 1},
            # The GCS declares a node that stopped answering dead within seconds (a real cluster: within a minute).
            "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3},
        },
    )
    cluster.add_node(num_cpus=1, resources={"policy": 1})
    ray.init(address=cluster.address, logging_level=logging.WARNING)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def place(resource: str):
    import ray

    return ray.remote(Worker).options(num_cpus=0, resources={resource: 1}).remote()


def watch(workers: dict[WorkerName, object]) -> tuple[WorkerWatch, list[tuple[float, LostWorker]]]:
    reports: list[tuple[float, LostWorker]] = []
    seen = threading.Event()

    def on_lost(lost: LostWorker) -> None:
        reports.append((time.monotonic(), lost))
        seen.set()

    started = WorkerWatch(workers, on_lost, node_grace_s=20).start()
    started.seen = seen  # type: ignore[attr-defined]
    return started, reports


def test_a_worker_whose_node_leaves_the_cluster_is_reported_lost_with_its_node_within_seconds(cluster):
    import ray

    rank, engine = place(POLICY), place(GENERATION)
    watched, reports = watch({WorkerName(POLICY, 0): rank, WorkerName(GENERATION, 0): engine})
    assert watched.places[WorkerName(POLICY, 0)].node_id != watched.places[WorkerName(GENERATION, 0)].node_id
    busy = rank.work.remote(120)  # a step in flight on it: the watch's call waits behind it

    worker_node = next(node for node in cluster.list_all_nodes() if not node.head)
    removed = time.monotonic()
    cluster.remove_node(worker_node, allow_graceful=False)  # the pod's processes killed at once

    assert watched.seen.wait(60), "the loss was never reported"  # type: ignore[attr-defined]
    watched.stop()
    ((when, lost),) = reports
    assert when - removed < 30, f"reported {when - removed:.0f}s after the node went"
    assert (lost.name, lost.node_gone) == (WorkerName(POLICY, 0), True)
    assert lost.what_happened() == "its node left the Ray cluster"
    at = watched.places[WorkerName(POLICY, 0)]
    assert lost.where() == f"host {at.host}, node {at.node_ip}", "outside Kubernetes: a host, not a pod"
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(busy, timeout=10)


def test_a_worker_whose_process_dies_on_a_node_that_stays_is_reported_dead_not_lost(cluster):
    import ray

    engine = place(GENERATION)
    watched, reports = watch({WorkerName(GENERATION, 0): engine})
    pid = ray.get(engine.pid.remote())
    engine.work.remote(120)

    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)  # out of memory, a segfault

    assert watched.seen.wait(30), "the death was never reported"  # type: ignore[attr-defined]
    watched.stop()
    ((when, lost),) = reports
    assert when - killed < 5, "the driver's own node stays: nothing to wait for"
    assert (lost.name, lost.node_gone) == (WorkerName(GENERATION, 0), False)
    assert lost.what_happened().startswith("its process died (The actor is dead because its worker process has died")


def test_a_step_whose_every_rollout_failed_is_blamed_on_the_environment_only_once_every_worker_answered(cluster):
    """A lost engine fails every rollout at once (its server refuses connections) while Ray may still call it alive:
    the loop asks the workers before it counts the step against spec.grpo.maxFailedSteps."""
    rank, engine = place(POLICY), place(GENERATION)
    stop = StopRequest()
    stop.worker_watch = WorkerWatch({WorkerName(POLICY, 0): rank, WorkerName(GENERATION, 0): engine}, stop.worker_lost)
    stop.worker_watch.node_grace_s = 20
    stop.worker_watch.start()

    asked = time.monotonic()
    assert stop.confirm_workers(timeout_s=30), "live workers answer"
    assert time.monotonic() - asked < 5, "within a second or two"
    assert not stop.requested

    worker_node = next(node for node in cluster.list_all_nodes() if not node.head)
    cluster.remove_node(worker_node, allow_graceful=False)
    assert not stop.confirm_workers(timeout_s=30), "a worker that never answers is not confirmed"
    stop.worker_watch.stop()
    assert stop.requested and stop.lost is not None, "the loss, not the environment, ends the run"
    assert (stop.lost.name, stop.lost.node_gone) == (WorkerName(POLICY, 0), True)


def test_a_retry_waits_for_the_clusters_resources_saying_what_it_waits_for(cluster, caplog):
    caplog.set_level(logging.INFO, "grpojob_trainer.cluster.workers")
    with pytest.raises(TimeoutError, match=r"within 2s: GPU 0 of 1, policy 1 of 2"):
        wait_for_workers({"policy": 2, "generation": 1, "GPU": 1}, timeout_s=2, poll_s=0.2)
    assert "waiting for the Ray cluster's worker pods" in caplog.text and "policy 1 of 2" in caplog.text

    done: list[float] = []
    started = time.monotonic()
    waiting = threading.Thread(
        target=lambda: (wait_for_workers({"policy": 2, "generation": 1}, timeout_s=60, poll_s=0.2), done.append(1))
    )
    waiting.start()
    time.sleep(2)
    assert not done, "it waits while the replacement pod is not there"
    cluster.add_node(num_cpus=1, resources={"policy": 1})  # the replacement pod joins
    waiting.join(60)
    assert done and time.monotonic() - started < 30
    assert "the Ray cluster's worker pods are back after" in caplog.text
