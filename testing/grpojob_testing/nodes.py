"""Manifests of the kwok-managed fake nodes: CPU nodes and GPU nodes shaped like 8-GPU H200 hosts.

GPU nodes carry the `nvidia.com/gpu:NoSchedule` taint, as GKE and the NVIDIA GPU operator set it; the
apiserver's ExtendedResourceToleration admission plugin adds the matching toleration to every pod
that requests `nvidia.com/gpu`, so only GPU pods land on GPU nodes.
"""

from __future__ import annotations

from typing import Any

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
GPU_RESOURCE = "nvidia.com/gpu"
NODE_ROLE_LABEL = "grpojob.dev/test-node-role"


def fake_node(name: str, *, cpu: str, memory: str, gpus: int = 0) -> dict[str, Any]:
    """A Node object that kwok manages (it sets Ready, heartbeats and runs the node's pods)."""
    capacity = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "500Gi"}
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        NODE_ROLE_LABEL: "gpu" if gpus else "cpu",
    }
    spec: dict[str, Any] = {}
    if gpus:
        capacity[GPU_RESOURCE] = str(gpus)
        labels["nvidia.com/gpu.product"] = "NVIDIA-H200"
        labels["nvidia.com/gpu.count"] = str(gpus)
        spec["taints"] = [{"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE}},
        "spec": spec,
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def fake_nodes(cpu_nodes: int = 2, gpu_nodes: int = 4, gpus_per_node: int = 8) -> list[dict[str, Any]]:
    """The default test fleet: ``cpu_nodes`` 16-core CPU nodes and ``gpu_nodes`` 8-GPU nodes."""
    nodes = [fake_node(f"kwok-cpu-{i}", cpu="16", memory="64Gi") for i in range(cpu_nodes)]
    nodes += [fake_node(f"kwok-gpu-{i}", cpu="96", memory="1536Gi", gpus=gpus_per_node) for i in range(gpu_nodes)]
    return nodes
