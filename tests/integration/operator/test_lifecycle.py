"""A GRPOJob's whole life on the real control plane, with the real KubeRay operator and kwok nodes."""

from __future__ import annotations

import pytest

from grpojob_api.endpoints import Endpoints

from .conftest import eventually, job_manifest

pytestmark = pytest.mark.integration


def test_a_job_runs_publishes_endpoints_after_the_head_is_ready_and_succeeds(operator, jobs, namespace):
    jobs.create(job_manifest("tiny"))
    jobs.wait_phase("tiny", "Running")

    # The endpoints were written only once the head pod was Ready (its own condition, the readiness probe
    # of the raylet and the GCS; KubeRay's HeadPodReady condition on the RayCluster copies it later, on
    # KubeRay's own reconcile, and may carry a later second).
    (head,) = jobs.pods("ray.io/cluster=tiny,ray.io/node-type=head")
    head_ready = next(c for c in head.status.conditions if c.type == "Ready")
    assert head_ready.status == "True"
    endpoints = jobs.core.read_namespaced_config_map("tiny-endpoints", namespace)
    assert endpoints.metadata.creation_timestamp >= head_ready.last_transition_time
    published = Endpoints.from_data(endpoints.data)  # as the pods read it
    assert published.ray_head_pod_ip == head.status.pod_ip
    assert published.ray_gcs_address == f"tiny-head-svc.{namespace}.svc.cluster.local:6379"
    assert published.policy_base_url == f"http://tiny-generation.{namespace}.svc.cluster.local:8000/v1"
    assert published.environment_urls == {
        "arithmetic": f"http://tiny-env-arithmetic.{namespace}.svc.cluster.local:8080"
    }
    assert (published.job_name, published.attempt) == ("tiny", 1)

    # Environments and the trainer came after the endpoints and read them through envFrom.
    deployment = jobs.apps.read_namespaced_deployment("tiny-env-arithmetic", namespace)
    trainer = jobs.batch.read_namespaced_job("tiny-trainer", namespace)
    for created in (deployment.metadata.creation_timestamp, trainer.metadata.creation_timestamp):
        assert created >= endpoints.metadata.creation_timestamp
    for pod_spec in (deployment.spec.template.spec, trainer.spec.template.spec):
        assert pod_spec.containers[0].env_from[0].config_map_ref.name == "tiny-endpoints"

    # GPU pods went to GPU nodes.
    nodes = {n.metadata.name: n for n in jobs.core.list_node().items}
    for pod in jobs.pods("ray.io/cluster=tiny,ray.io/node-type=worker"):
        assert "nvidia.com/gpu" in nodes[pod.spec.node_name].status.capacity

    status = jobs.status("tiny")
    assert status["gcsAddress"] == published.ray_gcs_address
    assert status["attempt"] == 1 and status["startTime"]

    # Running means the trainer pod runs; the environments' Deployment may report its ready replica a
    # moment later (the trainer waits for the environments itself), so the conditions come true soon after.
    def conditions() -> dict[str, dict]:
        return {c["type"]: c for c in jobs.status("tiny")["conditions"]}

    expected = ("RayClusterReady", "EndpointsPublished", "EnvironmentsReady", "TrainerRunning")
    eventually(lambda: all(conditions()[kind]["status"] == "True" for kind in expected), "every condition true", 30)
    for kind in expected:
        assert conditions()[kind]["reason"] and conditions()[kind]["lastTransitionTime"]

    # Progress reported by the trainer reaches the status (and `kubectl get grpojobs`).
    jobs.core.patch_namespaced_config_map("tiny-config", namespace, {"data": {"step": "7", "meanReward": "0.625"}})
    eventually(lambda: jobs.status("tiny").get("step") == 7, "the step to reach the status", 30)
    assert jobs.status("tiny")["meanReward"] == pytest.approx(0.625)

    # The trainer process exits 0: the job succeeds and the default cleanup policy removes the
    # RayCluster and the environments but keeps the trainer Job for its logs.
    (pod,) = jobs.trainer_pods("tiny")
    jobs.exit_pod(pod.metadata.name, 0)
    status = jobs.wait_phase("tiny", "Succeeded")
    assert status["completionTime"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["Complete"] == "True"
    eventually(lambda: not jobs.children("tiny")["RayCluster"], "the RayCluster to be deleted", 30)
    eventually(lambda: not jobs.children("tiny")["Deployment"], "the environments to be deleted", 30)
    assert jobs.children("tiny")["Job"] == ["tiny-trainer"]

    # One Event, for the end of the run (the way to Running is in the conditions).
    eventually(
        lambda: [reason for reason, _ in jobs.events("tiny")] == ["PhaseSucceeded"], "a PhaseSucceeded event", 30
    )

    metrics = operator.metrics()
    assert 'grpojob_jobs{phase="Succeeded"} 1.0' in metrics
    assert "grpojob_reconcile_duration_seconds_count" in metrics
    assert "grpojob_time_to_head_ready_seconds_count 1.0" in metrics


def test_deleting_the_job_removes_every_child(operator, jobs):
    jobs.create(job_manifest("gone"))
    jobs.wait_phase("gone", "Running")
    assert all(jobs.children("gone")[kind] for kind in ("RayCluster", "ConfigMap", "Service", "Deployment", "Job"))
    jobs.delete("gone")
    try:
        eventually(lambda: not any(jobs.children("gone").values()), "every child to be garbage-collected", 60)
    except TimeoutError as error:
        raise AssertionError(f"left behind: {jobs.children('gone')}") from error


def test_cleanup_policy_delete_all_and_ttl_remove_everything_after_success(operator, jobs):
    jobs.create(job_manifest("brief", cleanupPolicy="DeleteAll", ttlSecondsAfterFinished=2))
    jobs.wait_phase("brief", "Running")
    (pod,) = jobs.trainer_pods("brief")
    jobs.exit_pod(pod.metadata.name, 0)
    jobs.wait_phase("brief", "Succeeded")
    eventually(lambda: not jobs.children("brief")["Job"], "the trainer Job to be deleted (DeleteAll)", 30)

    def job_deleted() -> bool:
        try:
            jobs.get("brief")
        except Exception as error:
            return getattr(error, "status", None) == 404
        return False

    eventually(job_deleted, "ttlSecondsAfterFinished to delete the GRPOJob", 30)


def test_a_watched_job_gets_a_tensorboard_until_it_is_turned_off_and_a_trainer_that_logs_to_the_claim(
    operator, jobs, namespace
):
    logging = {"pvc": {"claimName": "logs", "path": "team-a"}, "tensorboard": True}
    jobs.create(job_manifest("viewed", logging=logging))

    def tensorboard() -> list[str]:
        children = jobs.children("viewed")
        return [kind for kind in ("Deployment", "Service") if "viewed-tensorboard" in children[kind]]

    eventually(lambda: tensorboard() == ["Deployment", "Service"], "the TensorBoard Deployment and Service", 60)
    eventually(lambda: "viewed-trainer" in jobs.children("viewed")["Job"], "the trainer Job", 60)
    trainer = jobs.batch.read_namespaced_job("viewed-trainer", namespace).spec.template.spec
    (container,) = trainer.containers
    assert {e.name: e.value for e in container.env}["GRPOJOB_LOG_DIR"] == "/data/logs/logs/viewed/attempt-1"
    assert [(p.name, p.container_port) for p in container.ports] == [("metrics", 9090)]
    (claim,) = [v for v in trainer.volumes if v.persistent_volume_claim is not None]
    assert claim.persistent_volume_claim.claim_name == "logs" and not claim.persistent_volume_claim.read_only
    viewer = jobs.apps.read_namespaced_deployment("viewed-tensorboard", namespace).spec.template.spec
    (claim,) = [v for v in viewer.volumes if v.persistent_volume_claim is not None]
    assert claim.persistent_volume_claim.read_only

    jobs.patch_spec("viewed", {"logging": {**logging, "tensorboard": False}})
    eventually(lambda: tensorboard() == [], "TensorBoard to be removed once turned off", 60)
