"""A kind node image for Kubernetes v1.34.4 made here, and what tests/e2e needs on a kind cluster.

    python -m grpojob_testing.kind build-node-image           # unless cached; loads it into podman
    python -m grpojob_testing.kind install-kuberay KUBECONFIG  # the KubeRay operator as a pod
    python -m grpojob_testing.kind archives                    # the image archives tests/e2e needs
    python -m grpojob_testing.kind load-images CLUSTER         # `kind load image-archive` each

No registry can be reached, so nothing of kind's own node image (``kindest/node``) is used but the
files kind's module ships for it (entrypoint, ``/kind/bin``, systemd units). The root filesystem is
Debian bookworm from ``debootstrap`` with the pinned packages of testing/node-packages.txt (the real
node's containerd 1.6, runc, CNI plugins, iptables) and testing/kind-node-packages.txt (systemd and
what kind's entrypoint and the kubelet call); kubeadm, the kubelet and kubectl are our pinned builds;
testing/kind/node/ holds our configuration (containerd, a static ptp CNI network instead of kindnetd,
which no module proxy serves). The control-plane images kubeadm runs (kube-apiserver, the controller
manager, the scheduler, kube-proxy, etcd, CoreDNS) are written from our programs under
``grpojob.dev/kind`` (testing/kind/cluster.yaml names them through kubeadm config patches) into
``/kind/images``, which a unit imports into the node's containerd at boot, before the kubelet starts.
The default StorageClass (``/kind/manifests/default-storage.yaml``, which kind applies) is our build
of local-path-provisioner, whose helper pods run the node's Debian as an image.

The image is cached as a docker-archive in ``~/.cache/grpojob/images/`` by a hash of its inputs and
loaded into podman's storage as ``NODE_IMAGE``, labelled with that hash.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from grpojob_testing import base_image, build, images, kuberay, node_images, oci

KIND_DIR = build.TESTING_DIR / "kind"
NODE_FILES = KIND_DIR / "node"
PACKAGE_LISTS = (build.TESTING_DIR / "node-packages.txt", build.TESTING_DIR / "kind-node-packages.txt")
REPOSITORY = "grpojob.dev/kind"
SUITE = "bookworm"
KUBERNETES_VERSION = build.load_components()["kubernetes"].version
NODE_IMAGE = f"{REPOSITORY}/node:{KUBERNETES_VERSION}"
KUBERAY_IMAGE = f"{REPOSITORY}/kuberay-operator:{build.load_components()['kuberay'].version}"
KUBERAY_PROGRAM = "/usr/local/bin/ray-operator"
KUBERAY_NAMESPACE = "kuberay-system"
MIRROR = "http://deb.debian.org/debian"
SOURCES = (
    f"deb {MIRROR} {SUITE} main\n"
    f"deb {MIRROR} {SUITE}-updates main\n"
    f"deb http://deb.debian.org/debian-security {SUITE}-security main\n"
)
TRIM = ("var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb", "var/log/*")
TRIM += ("usr/share/doc/*", "usr/share/man/*", "usr/share/info/*", "usr/share/locale/*")
# kind's base image: the systemd units it enables, and what its Dockerfile removes so that systemd
# in a container starts only what a node needs.
ENABLED_UNITS = ("kubelet.service", "containerd.service", "undo-mount-hacks.service", "grpojob-preload-images.service")
UNWANTED_UNITS = (
    "lib/systemd/system/sysinit.target.wants/systemd-tmpfiles-setup.service",
    "lib/systemd/system/multi-user.target.wants/*",
    "etc/systemd/system/*.wants/*",
    "lib/systemd/system/local-fs.target.wants/*",
    "lib/systemd/system/sockets.target.wants/*udev*",
    "lib/systemd/system/sockets.target.wants/*initctl*",
    "lib/systemd/system/basic.target.wants/*",
)
CHANGES = ("ENV=container=docker", "STOPSIGNAL=SIGRTMIN+3", 'ENTRYPOINT=["/usr/local/bin/entrypoint","/sbin/init"]')
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
NODE_PROGRAMS = ("kubernetes", "etcd", "coredns", "local-path-provisioner", "kind")
DEBIAN_IMAGE = f"{REPOSITORY}/debian:{SUITE}"


def debian_packages() -> list[str]:
    """``name=version`` of every pinned package of the node image."""
    lines = [line.strip() for path in PACKAGE_LISTS for line in path.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def cluster_images() -> dict[str, tuple[str, str]]:
    """Image name to (component of versions.toml, program) of every image of one program the node
    runs: those kubeadm runs, and the storage provisioner."""
    components = build.load_components()
    named = {f"{REPOSITORY}/{p}:{KUBERNETES_VERSION}": ("kubernetes", p) for p in (*CONTROL_PLANE, "kube-proxy")}
    for name in ("etcd", "coredns", "local-path-provisioner"):
        named[f"{REPOSITORY}/{name}:{components[name].version}"] = (name, name)
    return named


def _tree_digest(root: Path) -> list[tuple[str, str]]:
    return [
        (str(p.relative_to(root)), hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(root.rglob("*"))
        if p.is_file()
    ]


def _hash(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def debian_inputs_hash() -> str:
    """A hash of what the node's Debian root filesystem is made from."""
    inputs = {"suite": SUITE, "sources": SOURCES, "packages": debian_packages(), "trim": TRIM}
    return _hash({**inputs, "debootstrap": base_image.debootstrap_version()})


def inputs_hash() -> str:
    """A hash of everything the node image is made from: its Debian root filesystem, our files, the
    pinned programs (by their cache directories, named by version and go.mod hash), the code that
    puts them together."""
    components = build.load_components()
    return _hash(
        {
            "debian": debian_inputs_hash(),
            "units": [ENABLED_UNITS, UNWANTED_UNITS],
            "changes": CHANGES,
            "files": _tree_digest(NODE_FILES),
            "programs": sorted(components[name].bin_dir.name for name in NODE_PROGRAMS),
            "pause": hashlib.sha256(node_images.probe_binary().read_bytes()).hexdigest(),
            "code": [inspect.getsource(f) for f in (cluster_images, write_cluster_images, add_node_files)],
            "oci": hashlib.sha256(Path(oci.__file__).read_bytes()).hexdigest(),
        }
    )


def node_archive(digest: str) -> Path:
    """Where the node image built from inputs ``digest`` is cached."""
    return build.cache_root() / "images" / f"kind-node-{KUBERNETES_VERSION}-{digest}.docker.tar"


def _chroot(rootfs: Path, *command: str) -> None:
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    done = subprocess.run(["chroot", str(rootfs), *command], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} in the node image failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")


def _tar(rootfs: Path, target: Path) -> None:
    excludes = [f"--exclude=./{d}/*" for d in ("dev", "proc", "sys", "run", "tmp")]
    subprocess.run(["tar", "-C", str(rootfs), *excludes, "--sort=name", "-cf", str(target), "."], check=True)


def debian_rootfs_path() -> Path:
    """Where the node's Debian root filesystem of this tree's inputs is cached (`debian_rootfs_tar`)."""
    return build.cache_root() / "images" / f"kind-node-{SUITE}-{debian_inputs_hash()}.rootfs.tar"


def debian_rootfs_tar() -> Path:
    """The node's Debian root filesystem as a tar, made unless cached: debootstrap of bookworm and
    the pinned packages installed (no service started), trimmed."""
    target = debian_rootfs_path()
    if target.exists():
        return target
    for stale in target.parent.glob(f"kind-node-{SUITE}-*.rootfs.tar"):
        stale.unlink()
    with tempfile.TemporaryDirectory(prefix="grpojob-kind-debian-", dir=target.parent) as scratch:
        rootfs = Path(scratch) / "rootfs"
        try:
            subprocess.run(
                ["debootstrap", "--variant=minbase", SUITE, str(rootfs), MIRROR], check=True, stdout=subprocess.DEVNULL
            )
            (rootfs / "etc/apt/sources.list").write_text(SOURCES)
            policy = rootfs / "usr/sbin/policy-rc.d"
            policy.write_text("#!/bin/sh\nexit 101\n")
            policy.chmod(0o755)
            _chroot(rootfs, "apt-get", "update", "-qq")
            _chroot(rootfs, "apt-get", "install", "-qq", "--yes", "--no-install-recommends", *debian_packages())
            _chroot(rootfs, "apt-get", "clean")
            policy.unlink()
        finally:
            # An interrupted debootstrap leaves /proc mounted in the tree it was writing.
            subprocess.run(["umount", "--lazy", str(rootfs / "proc")], capture_output=True, check=False)
        for pattern in TRIM:
            for path in rootfs.glob(pattern):
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        partial = target.with_name(target.name + ".partial")
        _tar(rootfs, partial)
        partial.rename(target)
    return target


def write_cluster_images(debian: Path, directory: Path) -> None:
    """The images the node runs, one archive each, into ``directory``: those kubeadm runs, the
    storage provisioner, the pause image, and the node's Debian (local-path-provisioner's helper).
    Each holds one static program of ours, but kube-proxy, which calls iptables, is on top of the
    Debian root filesystem too (whose iptables kind's entrypoint set to the node's mode)."""
    bins = {name: build.build(component) for name, component in build.load_components().items()}
    directory.mkdir(parents=True, exist_ok=True)
    for reference, (component, program) in cluster_images().items():
        path = "/coredns" if program == "coredns" else f"/usr/local/bin/{program}"
        files = [oci.ImageFile(path, (bins[component] / program).read_bytes(), 0o755)]
        base = (debian,) if program == "kube-proxy" else ()
        oci.write_archive(directory / f"{program}.oci.tar", reference, files, [path], base)
    oci.write_archive(directory / "debian.oci.tar", DEBIAN_IMAGE, [], ["/bin/sh"], (debian,))
    for name, archive in node_images.write_archives(directory).items():
        if name != node_images.PAUSE_IMAGE:
            archive.unlink()


def add_node_files(rootfs: Path) -> None:
    """kind's base files, our configuration, our kubeadm, kubelet and kubectl, and the enabled units."""
    kind_files = build.module_dir(build.load_components()["kind"]) / "images" / "base" / "files"
    subprocess.run(["cp", "-r", "--no-preserve=mode,ownership", f"{kind_files}/.", str(rootfs)], check=True)
    subprocess.run(["cp", "-r", "--no-preserve=ownership", f"{NODE_FILES}/.", str(rootfs)], check=True)
    for executable in [*(rootfs / "kind/bin").iterdir(), *(rootfs / "usr/local/bin").iterdir()]:
        executable.chmod(0o755)
    # kind's containerd unit starts /usr/local/bin/containerd; Debian's is in /usr/bin.
    (rootfs / "usr/local/bin/containerd").symlink_to("/usr/bin/containerd")
    kubernetes = build.build(build.load_components()["kubernetes"])
    for program in ("kubeadm", "kubelet", "kubectl"):
        shutil.copy(kubernetes / program, rootfs / "usr/bin" / program)
    (rootfs / "kind/version").write_text(KUBERNETES_VERSION)
    (rootfs / "etc/kubernetes/manifests").mkdir(parents=True, exist_ok=True)
    for pattern in UNWANTED_UNITS:
        for path in rootfs.glob(pattern):
            path.unlink()
    with (rootfs / "etc/systemd/journald.conf").open("a") as journald:
        journald.write("ReadKMsg=no\n")
    (rootfs / "sbin/init").unlink(missing_ok=True)
    (rootfs / "sbin/init").symlink_to("/lib/systemd/systemd")
    _chroot(rootfs, "systemctl", "enable", *ENABLED_UNITS)
    _chroot(rootfs, "systemctl", "mask", "systemd-binfmt.service")


def build_node_image(log=sys.stderr) -> tuple[Path, bool]:
    """Build the node image unless cached, and have it in podman's storage as ``NODE_IMAGE``; return
    its archive and whether it was built."""
    digest = inputs_hash()
    archive = node_archive(digest)
    if archive.exists() and base_image.image_inputs(NODE_IMAGE) == digest:
        return archive, False
    with images.build_lock():
        return _build_node_image_locked(digest, archive, log)


def _build_node_image_locked(digest: str, archive: Path, log) -> tuple[Path, bool]:
    if archive.exists():
        if base_image.image_inputs(NODE_IMAGE) != digest:
            subprocess.run(["podman", "load", "--quiet", "--input", str(archive)], check=True)
        return archive, False
    started = time.monotonic()
    debian = debian_rootfs_tar()
    print(f"node root filesystem ready after {time.monotonic() - started:.0f}s", file=log, flush=True)
    with tempfile.TemporaryDirectory(prefix="grpojob-kind-node-", dir=archive.parent) as scratch:
        rootfs = Path(scratch) / "rootfs"
        rootfs.mkdir()
        subprocess.run(["tar", "-C", str(rootfs), "-xpf", str(debian)], check=True)
        write_cluster_images(debian, rootfs / "kind" / "images")
        add_node_files(rootfs)
        node_tar = Path(scratch) / "node.tar"
        _tar(rootfs, node_tar)
        changes = [*CHANGES, f"LABEL={base_image.INPUTS_LABEL}={digest}"]
        subprocess.run(
            ["podman", "import", "--quiet", *(f"--change={c}" for c in changes), str(node_tar), NODE_IMAGE],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    partial = archive.with_name(archive.name + ".partial")
    subprocess.run(
        ["podman", "save", "--quiet", "--format", "docker-archive", "--output", str(partial), NODE_IMAGE], check=True
    )
    partial.rename(archive)
    for stale in archive.parent.glob(node_archive("*").name):
        if stale != archive:
            stale.unlink()
    print(f"built {NODE_IMAGE} in {time.monotonic() - started:.0f}s", file=log, flush=True)
    return archive, True


def kuberay_archive_path() -> Path:
    """Where the KubeRay operator's image of the pinned version is cached (`kuberay_archive`)."""
    return build.cache_root() / "images" / f"kind-{build.load_components()['kuberay'].bin_dir.name}.oci.tar"


def kuberay_archive() -> Path:
    """The KubeRay operator's image (our pinned build, its one static program), written unless cached."""
    bin_dir = build.build(build.load_components()["kuberay"])
    target = kuberay_archive_path()
    if not target.exists():
        program = oci.ImageFile(KUBERAY_PROGRAM, (bin_dir / "ray-operator").read_bytes(), 0o755)
        partial = target.with_name(target.name + ".partial")
        oci.write_archive(partial, KUBERAY_IMAGE, [program], [KUBERAY_PROGRAM])
        partial.rename(target)
    return target


def archives() -> list[Path]:
    """Every image archive tests/e2e needs on the node: ours built from this tree (`images`), the
    KubeRay operator and the probe image."""
    found = []
    for image in images.images():
        archive = images.tree_archive(image)
        if archive is None:
            raise RuntimeError(f"{image.key} is not built from this tree: python -m grpojob_testing.images build")
        found.append(archive)
    probe = node_images.write_archives(build.cache_root() / "images" / "kind-node-images")[node_images.PROBE_IMAGE]
    return [*found, kuberay_archive(), probe]


def space_needed_to_load(sizes: list[int]) -> int:
    """Bytes a node needs to load archives of ``sizes`` one at a time, each one's layer blobs dropped
    after it is unpacked (`discard_layer_blobs`): every image unpacked, plus the blobs of the largest
    while it unpacks, plus a tenth for containerd's metadata and the pods' own writes."""
    return int((sum(sizes) + max(sizes, default=0)) * 1.1)


def load_images(cluster: str) -> None:
    """``kind load image-archive`` every archive of `archives` into the kind cluster ``cluster``,
    holding the image-build lock so that no build replaces an archive meanwhile, dropping each one's
    layer blobs from the node's content store once it is unpacked (`discard_layer_blobs`). Refuses
    at once, saying how much is missing, when the node's disk cannot hold them."""
    with images.build_lock():
        loading = archives()
        needed = space_needed_to_load([archive.stat().st_size for archive in loading])
        free = images.podman_free_bytes()  # the node's /var volume, into which the images unpack
        if free < needed:
            raise RuntimeError(
                f"loading {len(loading)} images into the kind node needs about {needed / 2**30:.1f} GiB, "
                f"but {free / 2**30:.1f} GiB is free: `python -m grpojob_testing.disk prune` removes what "
                "this tree does not use"
            )
        for archive in loading:
            command = ["kind", "load", "image-archive", "--name", cluster, str(archive)]
            print(" ".join(command), flush=True)
            subprocess.run(command, check=True)
            discard_layer_blobs(f"{cluster}-control-plane")


def discard_layer_blobs(node: str) -> None:
    """`images.discard_layer_blobs` in the containerd of kind node ``node``, which kind loads with
    ``ctr images import``."""
    engine = os.environ.get("KIND_EXPERIMENTAL_PROVIDER", "docker")
    images.discard_layer_blobs([engine, "exec", node, "ctr", "--namespace=k8s.io"])


def kuberay_objects() -> list[dict]:
    """The KubeRay operator as the test control plane runs it (no leader election), as a Deployment of
    our image, allowed everything (a test cluster's operator)."""
    namespace, name = KUBERAY_NAMESPACE, "kuberay-operator"
    labels = {"app.kubernetes.io/name": name}
    probe = {"httpGet": {"path": "/readyz", "port": 8082}, "periodSeconds": 2}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": name,
                        "containers": [
                            {
                                "name": name,
                                "image": KUBERAY_IMAGE,
                                "imagePullPolicy": "Never",
                                "args": kuberay.operator_args(":8082", ":8080"),
                                "readinessProbe": probe,
                                "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
                            }
                        ],
                    },
                },
            },
        },
    ]


def install_kuberay(kubeconfig: Path) -> None:
    """Install KubeRay's CRDs and its operator into the cluster of ``kubeconfig``; wait until it is ready."""
    bins = build.build(build.load_components()["kuberay"])
    kubectl = [str(build.build(build.load_components()["kubernetes"]) / "kubectl"), f"--kubeconfig={kubeconfig}"]
    subprocess.run([*kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(bins / "crds")], check=True)
    manifest = yaml.safe_dump_all(kuberay_objects())
    subprocess.run([*kubectl, "apply", "--server-side", "-f", "-"], input=manifest, text=True, check=True)
    subprocess.run(
        [
            *kubectl,
            "--namespace",
            KUBERAY_NAMESPACE,
            "rollout",
            "status",
            "deployment/kuberay-operator",
            "--timeout=5m",
        ],
        check=True,
    )


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(prog="python -m grpojob_testing.kind", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build-node-image", help=f"build {NODE_IMAGE} unless cached, load it into podman")
    commands.add_parser("archives", help="print the image archives tests/e2e needs, one a line")
    load = commands.add_parser("load-images", help="kind load image-archive each of them (kind on PATH)")
    load.add_argument("cluster", help="the kind cluster's name")
    install = commands.add_parser("install-kuberay", help="install KubeRay's CRDs and operator")
    install.add_argument("kubeconfig", type=Path)
    commands.add_parser("bin-dir", help="print the directory of our kind build")
    args = parser.parse_args(argv)
    if args.command == "build-node-image":
        archive, built = build_node_image()
        print(f"{NODE_IMAGE}: {archive} ({'built' if built else 'cached'})")
    elif args.command == "archives":
        try:
            print("\n".join(str(archive) for archive in archives()))
        except RuntimeError as error:
            print(error, file=sys.stderr)
            return 1
    elif args.command == "load-images":
        try:
            load_images(args.cluster)
        except RuntimeError as error:
            print(error, file=sys.stderr)
            return 1
    elif args.command == "install-kuberay":
        install_kuberay(args.kubeconfig)
    else:
        print(build.build(build.load_components()["kind"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
