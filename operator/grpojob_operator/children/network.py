"""The NetworkPolicy that lets only the job's own pods reach them."""

from __future__ import annotations

from grpojob_api import endpoints
from grpojob_api import v1alpha1 as api
from grpojob_operator import names
from grpojob_operator.children.meta import Manifest, job_ref, metadata, owner_reference


def build_network_policy(job: api.GRPOJob) -> Manifest:
    """Only the job's own pods reach the job's pods: the Ray head's GCS, dashboard and client ports,
    Ray's ports between nodes, the generation servers and the environments. The job's pods select each
    other by name and uid; traffic out of them is not restricted. Open to anyone: the ports meant for
    readers outside the job, the trainer's metrics (Prometheus) and TensorBoard (Ray listens on
    neither)."""
    job_name, _ = job_ref(job)
    own = owner_reference(job)
    pods = {names.JOB_LABEL: job_name, names.JOB_UID_LABEL: own["uid"]}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(job, names.ChildNames(job_name).network_policy, "network"),
        "spec": {
            "podSelector": {"matchLabels": pods},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": pods}}]},
                {"ports": [{"port": endpoints.TRAINER_METRICS_PORT}, {"port": endpoints.TENSORBOARD_PORT}]},
            ],
        },
    }
