"""Kueue in the test cluster: its configuration as a host process beside the control plane.

Kueue runs like the KubeRay operator, a program on this machine with the admin kubeconfig, every port on
loopback. Its admission webhooks are not registered with the API server: Kueue's internal certificate
management issues a serving certificate for its in-cluster Service name
(``kueue-webhook-service.kueue-system.svc``), which a webhook configuration pointing the API server at a
loopback address could not verify, and the path the tests use needs none of them: the operator writes
complete Workloads, and ClusterQueues, LocalQueues and ResourceFlavors take their defaults from the CRDs'
schemas. Kueue's start-up waits until its certificate is in its Secret (which must exist) and its CA is in
the conversion webhooks of its CRDs, so the CRDs get the conversion stanza Kueue's own kustomization adds
(`conversion_webhook`); the API server would call it only to convert between v1beta1 and v1beta2, and
everything here uses v1beta2 (Kueue's storage version). The on-demand visibility API is off: it would be
another server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

NAMESPACE = "kueue-system"
WEBHOOK_SERVICE = "kueue-webhook-service"
WEBHOOK_SECRET = "kueue-webhook-server-cert"
CRDS = ("clusterqueues", "localqueues", "resourceflavors", "workloads", "workloadpriorityclasses")
"""The CRDs (``<plural>.kueue.x-k8s.io``) the cluster waits for before starting Kueue."""
FRAMEWORKS = ("batch/job", "ray.io/raycluster")
"""Kueue's integrations with a controller that matters here: a Job or RayCluster carrying the queue-name
label would get a Workload of its own (the double admission a GRPOJob's children must never cause)."""


CONVERTED_CRDS = ("localqueues", "clusterqueues", "workloads", "cohorts", "multikueueclusters")
"""The CRDs Kueue injects its CA into (``pkg/util/cert`` of the module), by plural."""


def conversion_webhook() -> dict[str, Any]:
    """The ``spec.conversion`` of a converted CRD, as Kueue's ``config/components/crd/patches`` set it."""
    service = {"namespace": NAMESPACE, "name": WEBHOOK_SERVICE, "path": "/convert"}
    return {
        "strategy": "Webhook",
        "webhook": {"clientConfig": {"service": service}, "conversionReviewVersions": ["v1"]},
    }


def crds(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Kueue's CRDs as shipped in its module, with the conversion webhook on those that Kueue expects it on."""
    converted = {f"{plural}.kueue.x-k8s.io" for plural in CONVERTED_CRDS}
    out = []
    for crd in documents:
        if crd["metadata"]["name"] in converted:
            crd = {**crd, "spec": {**crd["spec"], "conversion": conversion_webhook()}}
        out.append(crd)
    return out


def config(health_port: int, metrics_port: int, webhook_port: int, cert_dir: Path) -> dict[str, Any]:
    """Kueue's `Configuration` (config.kueue.x-k8s.io/v1beta2) for a host process on loopback."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": WEBHOOK_SERVICE,
            "webhookSecretName": WEBHOOK_SECRET,
        },
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": list(FRAMEWORKS)},
        "featureGates": {"VisibilityOnDemand": False},
    }


def prerequisites() -> list[dict[str, Any]]:
    """What must exist before Kueue starts: its namespace and the (empty) Secret of its certificate."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": WEBHOOK_SECRET, "namespace": NAMESPACE}},
    ]
