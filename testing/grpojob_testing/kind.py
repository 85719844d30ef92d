"""A kind node image for Kubernetes v1.34.4 made here, and what tests/e2e needs on a kind cluster.

    python -m grpojob_testing.kind build-node-image           # unless cached; loads it into podman
    python -m grpojob_testing.kind install-kuberay KUBECONFIG  # the KubeRay operator as a pod
    python -m grpojob_testing.kind archives                    # the image archives to `kind load`

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

The image is cached as a docker-archive in ``~/.cache/grpojob/images/`` by a hash of its inputs and
loaded into podman's storage as ``NODE_IMAGE``, labelled with that hash.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grpojob_testing import base_image, build, images, node_images, oci

KIND_DIR = build.TESTING_DIR / "kind"
NODE_FILES = KIND_DIR / "node"
PACKAGE_LISTS = (build.TESTING_DIR / "node-packages.txt", build.TESTING_DIR / "kind-node-packages.txt")
REPOSITORY = "grpojob.dev/kind"
KUBERNETES_VERSION = build.load_components()["kubernetes"].version
NODE_IMAGE = f"{REPOSITORY}/node:{KUBERNETES_VERSION}"
KUBERAY_IMAGE = f"{REPOSITORY}/kuberay-operator:{build.load_components()['kuberay'].version}"
SUITE = "bookworm"
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
CHANGES = ("ENV=container=docker", "STOPSIGNAL=SIGRTMIN+3", 'ENTRYPOINT=["/usr/local/bin/entrypoint", "/sbin/init"]')
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")


def debian_packages() -> list[str]:
    """``name=version`` of every pinned package of the node image."""
    lines = [line.strip() for path in PACKAGE_LISTS for line in path.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def control_plane_images() -> dict[str, tuple[str, str]]:
    """Image name to (component of versions.toml, program) of every image kubeadm runs."""
    components = build.load_components()
    named = {f"{REPOSITORY}/{p}:{KUBERNETES_VERSION}": ("kubernetes", p) for p in (*CONTROL_PLANE, "kube-proxy")}
    named[f"{REPOSITORY}/etcd:{components['etcd'].version}"] = ("etcd", "etcd")
    named[f"{REPOSITORY}/coredns:{components['coredns'].version}"] = ("coredns", "coredns")
    return named


def _tree_digest(root: Path) -> list[tuple[str, str]]:
    return [
        (str(p.relative_to(root)), hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(root.rglob("*"))
        if p.is_file()
    ]


def inputs_hash() -> str:
    """A hash of everything the node image is made from: packages, suite, our files, the pinned
    programs (by their cache directories, named by version and go.mod hash), kind's files, this module."""
    components = build.load_components()
    inputs = {
        "suite": SUITE,
        "sources": SOURCES,
        "packages": debian_packages(),
        "trim": TRIM,
        "units": [ENABLED_UNITS, UNWANTED_UNITS],
        "changes": CHANGES,
        "files": _tree_digest(NODE_FILES),
        "programs": sorted(components[name].bin_dir.name for name in ("kubernetes", "etcd", "coredns", "kind")),
        "pause": hashlib.sha256(node_images.probe_binary().read_bytes()).hexdigest(),
        "module": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        "oci": hashlib.sha256(Path(oci.__file__).read_bytes()).hexdigest(),
        "debootstrap": base_image.debootstrap_version(),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def node_archive(digest: str) -> Path:
    """Where the node image built from inputs ``digest`` is cached."""
    return build.cache_root() / "images" / f"kind-node-{KUBERNETES_VERSION}-{digest}.docker.tar"


def _chroot(rootfs: Path, *command: str) -> None:
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    done = subprocess.run(["chroot", str(rootfs), *command], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} in the node image failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")


def make_debian_rootfs(rootfs: Path) -> None:
    """Debootstrap bookworm into ``rootfs`` and install the pinned packages (no service starts)."""
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
    for pattern in TRIM:
        for path in rootfs.glob(pattern):
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def write_control_plane_archives(rootfs: Path, base_layer: Path, directory: Path) -> None:
    """The images kubeadm runs, one archive each, into ``directory``: one static program each, but
    kube-proxy, which calls iptables, on top of the node's own Debian root filesystem (``base_layer``),
    whose iptables it shares (kind's entrypoint picks legacy or nft; kube-proxy's image does the same)."""
    bins = {name: build.build(component) for name, component in build.load_components().items()}
    directory.mkdir(parents=True, exist_ok=True)
    for reference, (component, program) in control_plane_images().items():
        binary = bins[component] / program
        files = [oci.ImageFile(f"/usr/local/bin/{program}", binary.read_bytes(), 0o755)]
        base = (base_layer,) if program == "kube-proxy" else ()
        entrypoint = ["/coredns"] if program == "coredns" else [f"/usr/local/bin/{program}"]
        if program == "coredns":
            files = [oci.ImageFile("/coredns", binary.read_bytes(), 0o755)]
        oci.write_archive(directory / f"{program}.oci.tar", reference, files, entrypoint, base)
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
    if archive.exists():
        if base_image.image_inputs(NODE_IMAGE) != digest:
            subprocess.run(["podman", "load", "--quiet", "--input", str(archive)], check=True)
        return archive, False
    started = time.monotonic()
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="grpojob-kind-node-", dir=archive.parent) as scratch:
        rootfs = Path(scratch) / "rootfs"
        make_debian_rootfs(rootfs)
        print(f"node root filesystem ready after {time.monotonic() - started:.0f}s", file=log, flush=True)
        base_layer = Path(scratch) / "debian.tar"
        excludes = [f"--exclude=./{d}/*" for d in ("dev", "proc", "sys", "run", "tmp")]
        subprocess.run(["tar", "-C", str(rootfs), *excludes, "--sort=name", "-cf", str(base_layer), "."], check=True)
        write_control_plane_archives(rootfs, base_layer, rootfs / "kind" / "images")
        base_layer.unlink()
        add_node_files(rootfs)
        node_tar = Path(scratch) / "node.tar"
        subprocess.run(["tar", "-C", str(rootfs), *excludes, "--sort=name", "-cf", str(node_tar), "."], check=True)
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


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(prog="python -m grpojob_testing.kind", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build-node-image", help=f"build {NODE_IMAGE} unless cached, load it into podman")
    args = parser.parse_args(argv)
    if args.command == "build-node-image":
        with images.build_lock():
            archive, built = build_node_image()
        print(f"{NODE_IMAGE}: {archive} ({'built' if built else 'cached'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
