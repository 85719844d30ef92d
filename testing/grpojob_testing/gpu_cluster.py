"""A test cluster whose real node has the machine's GPUs, our images made from the machine itself, and the
chart installed: what tests/gpu/test_e2e_gpu.py applies GRPOJobs to (`make e2e-gpu`).

    python -m grpojob_testing.gpu_cluster up      # prints the kubeconfig; the processes outlive the command
    python -m grpojob_testing.gpu_cluster node    # the first half of up: the cluster with its GPU node
    python -m grpojob_testing.gpu_cluster base    # after node: the machine's own layers, while the wheels travel
    python -m grpojob_testing.gpu_cluster images  # the second half: the images and the chart
    python -m grpojob_testing.gpu_cluster down

Steps: `cluster up --real-node --no-kwok --gpus` (the device plugin advertises ``nvidia.com/gpu``), the images
of `host_image` streamed into the node's containerd, then ``helm install`` of charts/grpojob into
``OPERATOR_NAMESPACE`` with those images. Root, a GPU, the node's packages (`make node-packages`, or
`gpu_node unpack` on the GPU machine) and the programs (`make cluster-binaries`, or `gpu_node unpack`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from grpojob_testing import build, host_image, node
from grpojob_testing.cluster import NVIDIA_DEVICE_GLOB, Cluster

CLUSTER_NAME = "gpu"
OPERATOR_NAMESPACE = "grpojob-system"
RELEASE = "grpojob"
CHART = build.TESTING_DIR.parent / "charts" / "grpojob"


def helm_install(kubeconfig: Path) -> None:
    """The chart with the images made from this machine (operator, Ray pods and trainer, environments)."""
    operator_repository, tag = host_image.OPERATOR.rsplit(":", 1)
    helm = build.build(build.load_components()["helm"]) / "helm"
    subprocess.run(
        [
            *(str(helm), f"--kubeconfig={kubeconfig}", "upgrade", "--install", RELEASE, str(CHART)),
            *(f"--namespace={OPERATOR_NAMESPACE}", "--create-namespace"),
            *(f"--set=image.repository={operator_repository}", f"--set=image.tag={tag}"),
            *(
                f"--set=defaults.rayImage={host_image.TRAINER}",
                f"--set=defaults.environmentImage={host_image.ENVIRONMENTS}",
            ),
            *("--wait", "--timeout=5m"),
        ],
        check=True,
    )


def start_node(device_glob: str = NVIDIA_DEVICE_GLOB, log=sys.stderr) -> Path:
    """Start the cluster with its GPU node; return the kubeconfig."""
    started = time.monotonic()
    kubeconfig = Cluster.named(CLUSTER_NAME).up(
        cpu_nodes=0, gpu_nodes=0, real_node=True, kwok=False, gpu_device_glob=device_glob, log=log
    )
    print(f"cluster with a GPU node up in {time.monotonic() - started:.0f}s", file=log, flush=True)
    return kubeconfig


def containerd_socket() -> str:
    """The socket of the running cluster's node's containerd."""
    return str(node.NodePaths(Cluster.named(CLUSTER_NAME).state_dir / "node").containerd_socket)


def import_base_image(log=sys.stderr) -> None:
    """Import the machine's own layers into the running cluster's node, ahead of the images (which then send
    only the layer of the wheels and our code)."""
    started = time.monotonic()
    host_image.import_base(containerd_socket())
    print(f"base layers imported in {time.monotonic() - started:.0f}s", file=log, flush=True)


def install_images_and_chart(site_packages: Path = Path("/tmp/site-packages"), log=sys.stderr) -> Path:
    """Import the images made of this machine into the running cluster's node, install the chart."""
    cluster = Cluster.named(CLUSTER_NAME)
    started = time.monotonic()
    host_image.import_into_containerd(containerd_socket(), site_packages)
    print(f"images imported in {time.monotonic() - started:.0f}s", file=log, flush=True)
    helm_install(cluster.kubeconfig)
    print(f"chart installed after {time.monotonic() - started:.0f}s", file=log, flush=True)
    return cluster.kubeconfig


def up(site_packages: Path = Path("/tmp/site-packages"), device_glob: str = NVIDIA_DEVICE_GLOB, log=sys.stderr) -> Path:
    """Start the cluster, import the images, install the chart; return the kubeconfig."""
    kubeconfig = start_node(device_glob, log)
    try:
        install_images_and_chart(site_packages, log)
    except BaseException:
        Cluster.named(CLUSTER_NAME).down(keep_logs=True)
        raise
    return kubeconfig


def down() -> None:
    Cluster.named(CLUSTER_NAME).down()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpojob_testing.gpu_cluster", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["up", "node", "base", "images", "down"])
    parser.add_argument("--site-packages", type=Path, default=Path("/tmp/site-packages"))
    parser.add_argument("--gpus", default=NVIDIA_DEVICE_GLOB, metavar="DEVICE_GLOB")
    args = parser.parse_args(argv)
    if args.command == "up":
        print(up(args.site_packages, args.gpus))
    elif args.command == "node":
        print(start_node(args.gpus))
    elif args.command == "base":
        import_base_image()
    elif args.command == "images":
        print(install_images_and_chart(args.site_packages))
    else:
        down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
