"""What the end-to-end suite puts into a cluster before a GRPOJob can run: our images on the real
node, requests small enough for its few cores, the operator (helm install), a volume with the tiny
model and the dataset. Every function works on kind too (there the images are loaded beforehand
with `kind load docker-image` and claims bind through kind's default StorageClass)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from grpojob_testing import build, images, node, node_images

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "grpojob"
TEST_NAMESPACE_LABEL = {"grpojob.dev/test": "true"}
DATA_CLAIM = "grpo-data"
SMALL_REQUESTS_POLICY = "grpojob-e2e-small-requests"


def image_names() -> dict[str, str]:
    """Image key (operator, trainer-cpu, environments) to the name the chart and the jobs use."""
    return {image.key: image.name for image in images.images()}


def real_node_paths(kubeconfig: Path) -> node.NodePaths | None:
    """The files of `grpojob_testing.cluster`'s real node, or None when there is none (kind, say)."""
    paths = node.NodePaths(kubeconfig.parent / "node")
    return paths if paths.containerd_socket.exists() else None


def load_images(paths: node.NodePaths) -> None:
    """Import our built image archives into the real node's containerd, holding the image-build
    lock so that no build replaces an archive meanwhile. A real node without our images is a broken
    setup (`make e2e` builds them first), so a missing archive fails the suite rather than skipping it."""
    with images.build_lock():
        try:
            images.load_all_into_containerd(paths.containerd_socket)
        except RuntimeError as error:
            pytest.fail(f"{error} (or run `make e2e`, which builds the images first)")
    # The node's own images again: `cluster up` imported them, but the node may have been up for long
    # enough for the kubelet's image GC to remove them under disk pressure.
    for archive in node_images.write_archives(paths.images_dir).values():
        images.load_into_containerd(archive, paths.containerd_socket)


def small_requests_policy() -> list[dict[str, Any]]:
    """A MutatingAdmissionPolicy and its binding that set every container's requests in the test
    namespaces to 100m CPU and 128Mi: the operator asks 2 CPUs and 8Gi per Ray pod, and the real
    node has the CI machine's 2 cores. Limits stay as the operator sets them."""
    expression = """Object{
  spec: Object.spec{
    containers: object.spec.containers.map(c, Object.spec.containers{
      name: c.name,
      resources: Object.spec.containers.resources{requests: {"cpu": "100m", "memory": "128Mi"}}
    })
  }
}"""
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1beta1",
            "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": SMALL_REQUESTS_POLICY},
            "spec": {
                "matchConstraints": {
                    "resourceRules": [
                        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                    ]
                },
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": expression}}],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1beta1",
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {"name": SMALL_REQUESTS_POLICY},
            "spec": {
                "policyName": SMALL_REQUESTS_POLICY,
                "matchResources": {"namespaceSelector": {"matchLabels": TEST_NAMESPACE_LABEL}},
            },
        },
    ]


def apply_small_requests_policy(api_client) -> bool:
    """Install the policy where the API serves it (our real node's apiserver; kind with the feature
    gate); return whether it is installed. Elsewhere pods keep the operator's requests."""
    custom = client.CustomObjectsApi(api_client)
    group, version = "admissionregistration.k8s.io", "v1beta1"
    for obj, plural in zip(
        small_requests_policy(), ("mutatingadmissionpolicies", "mutatingadmissionpolicybindings"), strict=True
    ):
        try:
            custom.create_cluster_custom_object(group, version, plural, obj)
        except ApiException as error:
            if error.status == 404:
                return False
            if error.status != 409:
                raise
    time.sleep(2)  # the policy reaches the admission chain through an informer
    return True


def helm() -> str:
    """The pinned helm of the test cluster's build, or the one on PATH (kind users)."""
    pinned = build.load_components()["helm"].bin_dir / "helm"
    return str(pinned) if pinned.exists() else "helm"


def helm_install(kubeconfig: Path, namespace: str, release: str) -> None:
    """Install the chart with our images: the operator, and the CPU trainer image for Ray pods."""
    names = image_names()
    operator_repo, operator_tag = names["operator"].rsplit(":", 1)
    subprocess.run(
        [
            helm(),
            f"--kubeconfig={kubeconfig}",
            "install",
            release,
            str(CHART),
            f"--namespace={namespace}",
            f"--set=image.repository={operator_repo}",
            f"--set=image.tag={operator_tag}",
            f"--set=defaults.rayImage={names['trainer-cpu']}",
            f"--set=defaults.environmentImage={names['environments']}",
            "--wait",
            "--timeout=5m",
        ],
        check=True,
    )


def helm_uninstall(kubeconfig: Path, namespace: str, release: str) -> None:
    subprocess.run([helm(), f"--kubeconfig={kubeconfig}", "uninstall", release, f"--namespace={namespace}"])


def has_default_storage_class(api_client) -> bool:
    annotation = "storageclass.kubernetes.io/is-default-class"
    classes = client.StorageV1Api(api_client).list_storage_class().items
    return any((c.metadata.annotations or {}).get(annotation) == "true" for c in classes)


def create_data_claim(api_client, namespace: str) -> Path | None:
    """The claim the job mounts. Without a default StorageClass (our real node), a hostPath volume
    in a fresh host directory is bound to it; that directory is returned for removal."""
    core = client.CoreV1Api(api_client)
    claim: dict[str, Any] = {
        "metadata": {"name": DATA_CLAIM},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    host_dir = None
    if not has_default_storage_class(api_client):
        host_dir = Path(tempfile.mkdtemp(prefix="grpojob-e2e-"))
        host_dir.chmod(0o777)  # the pods run as UID 1000
        volume_name = f"grpo-data-{uuid.uuid4().hex[:8]}"
        core.create_persistent_volume(
            {
                "metadata": {"name": volume_name, "labels": {"grpojob.dev/e2e-namespace": namespace}},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "hostPath": {"path": str(host_dir), "type": "Directory"},
                    "claimRef": {"namespace": namespace, "name": DATA_CLAIM},
                },
            }
        )
        claim["spec"]["storageClassName"] = ""
        claim["spec"]["volumeName"] = volume_name
    core.create_namespaced_persistent_volume_claim(namespace, claim)
    return host_dir


def delete_data_volume(api_client, namespace: str, host_dir: Path | None) -> None:
    core = client.CoreV1Api(api_client)
    for volume in core.list_persistent_volume(label_selector=f"grpojob.dev/e2e-namespace={namespace}").items:
        core.delete_persistent_volume(volume.metadata.name)
    if host_dir is not None:
        shutil.rmtree(host_dir, ignore_errors=True)


def write_model_and_dataset_pod(rows: int) -> dict[str, Any]:
    """A pod of the trainer image that writes the tiny model and the arithmetic rows into the claim."""
    script = (
        "grpojob tiny-model /data/tiny-model"
        f" && python -m grpojob_trainer.environments.dataset arithmetic --rows {rows} --out /data/train.jsonl"
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "write-model"},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsUser": 1000, "runAsGroup": 100, "fsGroup": 100},
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": DATA_CLAIM}}],
            "containers": [
                {
                    "name": "write",
                    "image": image_names()["trainer-cpu"],
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", script],
                    "env": [{"name": "HOME", "value": "/tmp"}],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
        },
    }
