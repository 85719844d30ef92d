"""Two operator replicas, one Lease: exactly one reconciles, and when it dies the other takes over with
no child duplicated or lost."""

from __future__ import annotations

import pytest
from kubernetes import client

from grpojob_testing.cluster import wait_until

from .conftest import GROUP, PLURAL, VERSION, OperatorProcess, eventually, job_manifest
from .test_writes import owned_children, writes

pytestmark = pytest.mark.integration

LEASE = "grpojob-operator"
LEASE_SECONDS = 5
EXITED_AFTER_A_WRITE = 3


def holder(coordination: client.CoordinationV1Api, namespace: str) -> str | None:
    try:
        return coordination.read_namespaced_lease(LEASE, namespace).spec.holder_identity
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise


def test_a_standby_replica_takes_over_from_a_leader_killed_mid_job(
    kubeconfig, api_client, namespace, grpojob_crd, jobs, tmp_path
):
    coordination = client.CoordinationV1Api(api_client)
    election = {"GRPOJOB_LEADER_ELECTION_NAMESPACE": namespace, "GRPOJOB_LEASE_DURATION_SECONDS": str(LEASE_SECONDS)}
    leader = OperatorProcess(kubeconfig, namespace, tmp_path / "leader.log")
    standby = OperatorProcess(kubeconfig, namespace, tmp_path / "standby.log")
    try:
        # The leader dies abruptly (as if SIGKILLed) after its fifth write, halfway through creating the
        # job's children; it holds the Lease before the standby starts.
        leader.start(GRPOJOB_EXIT_AFTER_WRITES="5", **election)
        wait_until(lambda: holder(coordination, namespace) is not None, "the first replica to hold the Lease", 30)
        first_holder = holder(coordination, namespace)
        standby.start(**election)
        eventually(lambda: "grpojob_api_writes_total" in _metrics_or_empty(standby), "the standby to serve metrics")

        jobs.create(job_manifest("handover"))
        assert leader.wait_exit(60) == EXITED_AFTER_A_WRITE, leader.log()[-3000:]
        assert sum(writes(standby).values()) == 0, "a standby writes nothing while the leader lives"

        jobs.wait_phase("handover", "Running", timeout=90)
        assert holder(coordination, namespace) not in (None, first_holder)
        assert sum(writes(standby).values()) > 0
        # Every child exists, each created once: the leader's five writes were creates (children come before
        # the first status write), and the standby re-created none of them.
        children = owned_children(jobs, "handover")
        standby_creates = sum(n for (verb, kind), n in writes(standby).items() if verb == "POST" and kind != "Event")
        assert 5 + standby_creates == len(children), (writes(standby), children)
        assert {("RayCluster", "handover"), ("Job", "handover-trainer"), ("ConfigMap", "handover-endpoints")} <= set(
            children
        )
        assert len(jobs.trainer_pods("handover")) == 1
        assert jobs.status("handover")["attempt"] == 1
    finally:
        custom = client.CustomObjectsApi(api_client)
        custom.delete_collection_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        leader.stop()
        standby.stop()


def _metrics_or_empty(process: OperatorProcess) -> str:
    try:
        return process.metrics()
    except OSError:
        return ""
