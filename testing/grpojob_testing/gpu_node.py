"""Carry the real test node to a GPU machine that reaches no registry, in parts small enough for one
device call each, and look at what that machine's kernel allows (`make e2e-gpu`, benchmarks/device/e2e-gpu.sh).

    python -m grpojob_testing.gpu_node pack OUT          # here: OUT/p0/part_00, OUT/p1/part_01, ...
    python -m grpojob_testing.gpu_node unpack PARTS_DIR  # there: programs into the cache, packages installed
    python -m grpojob_testing.gpu_node capabilities      # there, first: cgroups, netfilter, bridge, overlay, ...

What travels, as one xz-compressed tar split into parts of at most ``PART_BYTES``:

- the programs a cluster with a real GPU node runs (`cluster up --real-node --no-kwok --gpus`), as their
  built cache directories (``bin/<name>-<version>-<fingerprint>/``, ``.complete`` included), so that
  `grpojob_testing.build` finds them built and needs no Go there: kube-apiserver, kube-controller-manager,
  kube-scheduler, kubectl, kubelet and kube-proxy (not kubeadm), etcd, the KubeRay operator with its CRDs,
  CoreDNS, helm, the device plugin, and grpojob-probe (the node's pause image). Not kwok (no fake nodes
  there), Kueue (optional: the cluster runs without it), kind or local-path-provisioner;
- the node's Debian packages at the versions of testing/node-packages.txt (containerd, runc, the CNI plugins,
  iptables) and the libraries iptables needs, installed with dpkg there (a library already installed is left
  as it is);
- the wheels of the operator's packages that the GPU machine lacks (kopf, the Kubernetes client and what they
  need beyond the machine's packages and the vLLM/Ray wheels), at the versions of this machine's environment,
  for the image `grpojob_testing.host_image` makes there.

Unpacking needs nothing but Python (``lzma``, ``tarfile``), dpkg and pip.
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from grpojob_testing import build

PART_BYTES = 60 * 2**20
"""A device call carries at most 64 MiB with the working tree: one part and the repository."""
XZ_FILTER = "--lzma2=preset=6,dict=256MiB"
"""One xz stream with a dictionary larger than any program: kube-apiserver, kube-controller-manager,
kube-scheduler, kube-proxy, the kubelet and kubectl share most of their code, and a window that holds the
previous ones finds it. The programs (about 690 MiB) came to 73 MiB so, against 131 MiB with xz -6's 8 MiB
window; it takes one thread about 8 minutes and 3 GB here, and 256 MiB to decompress."""
PROGRAMS = {
    "kubernetes": ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet", "kube-proxy"),
    "etcd": ("etcd",),
    "kuberay": ("ray-operator", "crds"),
    "coredns": ("coredns",),
    "helm": ("helm",),
    "device-plugin": ("device-plugin",),
}
"""What a cluster with a real GPU node runs, by component of versions.toml."""
IPTABLES_LIBRARIES = ("libip4tc2", "libip6tc2", "libxtables12")
"""Libraries iptables needs at its own exact version: installed even over another version."""
OTHER_LIBRARIES = (
    *("libmnl0", "libnetfilter-conntrack3", "libnfnetlink0", "libnftnl11", "libseccomp2", "netbase"),
    *("libbpf1", "libelf1", "libbsd0", "libmd0", "libcap2", "zlib1g"),  # iproute2's `ip`
)
"""Libraries the node's packages need at some version: installed only where missing, by package or by the
shared objects it ships (another distribution may name the package otherwise: Ubuntu's libelf1t64)."""
OPERATOR_WHEELS = (
    "kopf",
    "kubernetes",
    "aiohttp-retry",
    "durationpy",
    "oauthlib",
    "requests-oauthlib",
    "websocket-client",
    "iso8601",
    "jsonpatch",
    "jsonpointer",
)
"""The operator's packages (pyproject's `operator` extra) and their requirements that neither the GPU machine's
image (KINDS.md's list) nor the vLLM/Ray wheels (../shared/gpu/gpu-wheels.txt) hold; all pure Python."""
RAY_POD_WHEELS = (
    *("aiohttp-cors", "colorful", "py-spy", "smart-open", "virtualenv", "distlib", "platformdirs", "python-discovery"),
    *("opencensus", "opencensus-context", "google-api-core", "googleapis-common-protos", "proto-plus", "google-auth"),
    *("pyasn1", "pyasn1-modules"),
    *("opentelemetry-api", "opentelemetry-sdk", "opentelemetry-semantic-conventions"),
    *("opentelemetry-exporter-prometheus", "opentelemetry-proto"),
)
"""What ``ray[default]`` adds to Ray, and their requirements, that neither the GPU machine's image nor the
vLLM/Ray wheels hold: without them Ray's dashboard agent serves no ``/api/healthz``, and KubeRay's probes never
find a Ray pod ready. At the pins of the GPU trainer image's lock (images/vllm-requirements.txt)."""
RAY_DEFAULT_ELSEWHERE = ("aiohttp", "requests", "grpcio", "pydantic", "prometheus-client")
"""The rest of what ``ray[default]`` requires, which the GPU machine's image or the vLLM/Ray wheels hold."""
TESTING_WHEELS = ("cryptography", "cffi", "pycparser")
"""What the test cluster's tooling needs beyond the GPU machine's image (the certificates: `pki`), at the GPU
image's pins: the node is started before the vLLM/Ray wheels, which hold these too, arrive."""
GPU_LOCK = build.TESTING_DIR.parent / "images" / "vllm-requirements.txt"


# -- here ------------------------------------------------------------------------------------------


def program_paths() -> Iterator[tuple[Path, str]]:
    """(file or folder, name in the archive) of every program carried, and each directory's ``.complete``;
    and grpojob-probe, the node's pause and test image (`node_images`), which is built with Go too."""
    from grpojob_testing import node_images

    probe = node_images.probe_binary()
    yield probe, f"bin/{probe.parent.name}/{probe.name}"
    components = build.load_components()
    for name, programs in PROGRAMS.items():
        directory = build.build(components[name])
        for program in (*programs, ".complete"):
            yield directory / program, f"bin/{directory.name}/{program}"


def download_debs(directory: Path) -> list[Path]:
    """The node's packages at their pinned versions, and the libraries they need at this machine's versions
    (`apt-get download`: the repository of this Debian release)."""
    from grpojob_testing import node  # its certificates need `cryptography`, which `capabilities` does without

    wanted = [f"{name}={version}" for name, version in node.debian_packages().items()]
    for library in (*IPTABLES_LIBRARIES, *OTHER_LIBRARIES):
        version = (
            subprocess.run(["apt-cache", "policy", library], capture_output=True, text=True, check=True)
            .stdout.split("Candidate:")[1]
            .split()[0]
        )
        wanted.append(f"{library}={version}")
    subprocess.run(["apt-get", "download", "-qq", *wanted], cwd=directory, check=True)
    return sorted(directory.glob("*.deb"))


def locked_pins(names: tuple[str, ...], lock: Path = GPU_LOCK) -> list[str]:
    """``name==version`` of each name as the lock pins it; an error names those it lacks."""
    pinned = {}
    for line in lock.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pinned[_normalised_name(name)] = version.split()[0]
    missing = [name for name in names if _normalised_name(name) not in pinned]
    if missing:
        raise ValueError(f"{lock.name} pins none of {', '.join(missing)}")
    return [f"{name}=={pinned[_normalised_name(name)]}" for name in names]


def _normalised_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def download_wheels(directory: Path) -> list[Path]:
    """The operator's wheels for CPython 3.12, at the versions installed in this environment; the Ray pods'
    and the test tooling's, at the GPU image's pins."""
    pins = [f"{name}=={metadata.version(name)}" for name in OPERATOR_WHEELS]
    pins += locked_pins((*RAY_POD_WHEELS, *TESTING_WHEELS))
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"),
            *("--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux2014_x86_64"),
            *("--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_34_x86_64"),
            *("--dest", str(directory), *pins),
        ],
        check=True,
    )
    return sorted(directory.glob("*.whl"))


class _PartWriter(io.RawIOBase):
    """A binary sink that cuts what it is given into ``out/p<i>/part_<ii>`` files of ``size`` bytes."""

    def __init__(self, out: Path, size: int) -> None:
        self.out, self.size, self.parts, self._file, self._left = out, size, [], None, 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data)
        while view:
            if self._left == 0:
                self._next()
            chunk = view[: self._left]
            self._file.write(chunk)
            self._left -= len(chunk)
            view = view[len(chunk) :]
        return len(data)

    def _next(self) -> None:
        if self._file is not None:
            self._file.close()
        index = len(self.parts)
        path = self.out / f"p{index}" / f"part_{index:02d}"
        path.parent.mkdir(parents=True)
        self.parts.append(path)
        self._file, self._left = path.open("wb"), self.size

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        super().close()


def write_parts(members: list[tuple[Path, str]], out: Path, part_bytes: int) -> list[Path]:
    """Tar ``members`` (path, name in the archive), compress with xz and cut into parts of ``part_bytes``
    under ``out``; return the parts."""
    sink = _PartWriter(out, part_bytes)
    xz = subprocess.Popen(["xz", "-T1", XZ_FILTER, "-c"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def drain() -> None:
        while chunk := xz.stdout.read(1 << 20):
            sink.write(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    with tarfile.open(fileobj=xz.stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path, name in members:
            tar.add(path, arcname=name)
    xz.stdin.close()
    reader.join()
    if xz.wait() != 0:
        raise RuntimeError("xz failed")
    sink.close()
    return sink.parts


def read_parts(parts_dir: Path, destination: Path) -> None:
    """Extract the parts under ``parts_dir`` (``part_*``, in the order of their names) into ``destination``,
    with Python alone."""
    parts = sorted(parts_dir.glob("**/part_*"), key=lambda p: p.name)
    if not parts:
        raise SystemExit(f"no part_* under {parts_dir}")
    with (
        lzma.open(io.BufferedReader(_Concatenated(parts), buffer_size=1 << 20)) as stream,
        tarfile.open(fileobj=stream, mode="r|") as tar,
    ):
        tar.extractall(destination, filter="tar")


def pack(out: Path, part_bytes: int = PART_BYTES) -> dict:
    """Write the parts into ``out`` (emptied first); return a summary (sizes in bytes)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as scratch:
        debs = download_debs(Path(scratch))
        wheels_dir = Path(scratch) / "wheels"
        wheels_dir.mkdir()
        wheels = download_wheels(wheels_dir)
        members = [*program_paths()]
        members += [(deb, f"debs/{deb.name}") for deb in debs]
        members += [(wheel, f"wheels/{wheel.name}") for wheel in wheels]
        raw = sum(_size(path) for path, _ in members)
        parts = write_parts(members, out, part_bytes)
    summary = {
        "raw_bytes": raw,
        "compressed_bytes": sum(p.stat().st_size for p in parts),
        "parts": [str(p.relative_to(out)) for p in parts],
        "programs": sorted({name.split("/")[1] for _, name in members if name.startswith("bin/")}),
        "debs": [d.name for d in debs],
        "wheels": [w.name for w in wheels],
    }
    (out / "manifest.json").write_text(json.dumps(summary, indent=2))
    return summary


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


# -- there -----------------------------------------------------------------------------------------


class _Concatenated(io.RawIOBase):
    """The parts, read one after the other as one stream."""

    def __init__(self, parts: list[Path]) -> None:
        self._parts, self._file = list(parts), None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while True:
            if self._file is None:
                if not self._parts:
                    return 0
                self._file = self._parts.pop(0).open("rb")
            count = self._file.readinto(buffer)
            if count:
                return count
            self._file.close()
            self._file = None


def unpack(parts_dir: Path, site_packages: Path = Path("/tmp/site-packages")) -> None:
    """Extract the programs into this machine's cache, install the packages (dpkg) and the wheels
    (pip, into ``site_packages``); say what the programs' directories should be called here and are not
    (a tree other than the one packed)."""
    staging = Path(tempfile.mkdtemp(prefix="grpojob-node-"))
    read_parts(parts_dir, staging)
    bin_root = build.cache_root() / "bin"
    bin_root.mkdir(parents=True, exist_ok=True)
    for directory in sorted((staging / "bin").iterdir()):
        shutil.rmtree(bin_root / directory.name, ignore_errors=True)
        shutil.move(directory, bin_root / directory.name)
    components = build.load_components()
    for name in PROGRAMS:
        if not (components[name].bin_dir / ".complete").exists():
            print(f"warning: {components[name].bin_dir.name} was not carried: the parts come from another tree")
    install_debs(sorted((staging / "debs").glob("*.deb")))
    wheels = sorted(str(w) for w in (staging / "wheels").glob("*.whl"))
    installed = staging / "site-packages"
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"),
            *("--target", str(installed), *wheels),
        ],
        check=True,
    )
    merge_site_packages(installed, site_packages)
    shutil.rmtree(staging)


def merge_site_packages(source: Path, target: Path) -> None:
    """Move ``source``'s packages into ``target``, replacing packages of the same name but adding to
    ``bin/`` script by script (``pip --target --upgrade`` replaces the whole ``bin/``, and with it the
    ``ray`` and ``vllm`` commands the GPU wheels put there)."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in sorted(source.iterdir()):
        if entry.name == "bin":
            (target / "bin").mkdir(exist_ok=True)
            for script in sorted(entry.iterdir()):
                (target / "bin" / script.name).unlink(missing_ok=True)
                shutil.move(script, target / "bin" / script.name)
            continue
        destination = target / entry.name
        if destination.is_dir() and not destination.is_symlink():
            shutil.rmtree(destination)
        else:
            destination.unlink(missing_ok=True)
        shutil.move(entry, destination)


def install_debs(debs: list[Path]) -> None:
    """dpkg-install the node's packages and iptables' own libraries, and the other libraries where missing."""
    chosen = [str(deb) for deb in debs if deb.name.split("_", 1)[0] not in OTHER_LIBRARIES or not _library_present(deb)]
    # --force-depends: a library of another name on this distribution (say, Ubuntu's t64 renames) will do.
    subprocess.run(
        ["dpkg", "-i", "--force-depends", "--force-confold", *chosen],
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        check=True,
    )


def _library_present(deb: Path) -> bool:
    """Whether this machine has the library package ``deb``: installed under its name, or every shared object
    name it ships (``libelf.so.1``) already in place, from a package of another name."""
    package = deb.name.split("_", 1)[0]
    status = subprocess.run(["dpkg-query", "-W", "-f", "${Status}", package], capture_output=True, text=True)
    if status.stdout.endswith("installed"):
        return True
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    names = [Path(line.split()[5]).name for line in listing.splitlines()]
    sonames = [name for name in names if re.search(r"\.so\.\d+$", name)]
    directories = (Path("/lib/x86_64-linux-gnu"), Path("/usr/lib/x86_64-linux-gnu"))
    return bool(sonames) and all(any((d / name).exists() for d in directories) for name in sonames)


def capabilities() -> dict[str, object]:
    """What this machine's kernel and user space allow a real node: cgroups, modules, sysctls, tools."""

    def read(path: str) -> str:
        try:
            return Path(path).read_text().strip()
        except OSError as error:
            return f"({error.strerror})"

    def sh(command: str) -> str:
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
        return (done.stdout + done.stderr).strip()

    modules = read("/proc/modules")
    prefixes = ("nf_", "nft_", "ip_", "ipt", "x_t", "xt_", "br", "overlay", "veth", "nvidia")
    filesystems = read("/proc/filesystems")
    config = sh(f"zcat /proc/config.gz 2>/dev/null || cat /boot/config-{os.uname().release} 2>/dev/null")
    wanted_config = (
        "CONFIG_BRIDGE=",
        "CONFIG_BRIDGE_NETFILTER=",
        "CONFIG_OVERLAY_FS=",
        "CONFIG_VETH=",
        "CONFIG_NF_TABLES=",
        "CONFIG_NFT_COMPAT=",
        "CONFIG_NF_NAT=",
        "CONFIG_IP_NF_IPTABLES=",
        "CONFIG_IP_NF_NAT=",
        "CONFIG_NETFILTER_XT_MATCH_COMMENT=",
        "CONFIG_NETFILTER_XT_MATCH_CONNTRACK=",
        "CONFIG_NETFILTER_XT_MARK=",
        "CONFIG_IP_VS=",
        "CONFIG_CGROUP_DEVICE=",
        "CONFIG_CGROUP_BPF=",
        "CONFIG_MEMCG=",
        "CONFIG_CGROUP_PIDS=",
        "CONFIG_CGROUP_HUGETLB=",
        "CONFIG_SECCOMP=",
        "CONFIG_USER_NS=",
        "CONFIG_NET_NS=",
    )
    return {
        "uname": " ".join(os.uname()),
        "os-release": sh(". /etc/os-release && echo $PRETTY_NAME"),
        "root filesystem": sh("findmnt -n -o FSTYPE,SOURCE,OPTIONS / || mount | grep ' / '"),
        "disk free": sh("df -h / /tmp /root | tail -n +2"),
        "cgroup": sh("stat -fc %T /sys/fs/cgroup; ls /sys/fs/cgroup | head -30 | tr '\\n' ' '"),
        "cgroup v2 controllers": read("/sys/fs/cgroup/cgroup.controllers"),
        "cgroup v1 hierarchies": sh("grep -v '^#' /proc/cgroups | awk '$4==1{print $1}' | tr '\\n' ' '"),
        "overlay filesystem": "overlay" in filesystems,
        "modules loaded (netfilter, bridge, overlay, nvidia)": " ".join(
            line.split()[0] for line in modules.splitlines() if line.split()[0].startswith(prefixes)
        ),
        "kernel config": "\n".join(line for line in config.splitlines() if line.startswith(wanted_config))
        or "(no /proc/config.gz or /boot/config: modules are built in or absent)",
        "ip_forward": read("/proc/sys/net/ipv4/ip_forward"),
        "bridge-nf-call-iptables": read("/proc/sys/net/bridge/bridge-nf-call-iptables"),
        "modprobe br_netfilter overlay": sh("modprobe br_netfilter 2>&1; modprobe overlay 2>&1; echo rc=$?"),
        "tools": sh(
            "for t in dpkg apt-get ip iptables nft modprobe mount unshare nsenter ldconfig nvidia-smi containerd runc;"
            " do printf '%s=%s ' $t $(command -v $t || echo missing); done"
        ),
        "iptables": sh("iptables -V 2>&1; iptables -t nat -S 2>&1 | head -3"),
        "nft": sh("nft list tables 2>&1 | head -3"),
        "network namespace + veth": sh(
            "ip netns add grpojob-probe && ip link add gp0 type veth peer name gp1 netns grpojob-probe"
            " && echo ok; ip link del gp0 2>/dev/null; ip netns del grpojob-probe 2>/dev/null"
        ),
        "bridge": sh("ip link add grpojob-probe type bridge && echo ok; ip link del grpojob-probe 2>/dev/null"),
        "user namespaces": read("/proc/sys/user/max_user_namespaces"),
        "nvidia devices": sh("ls -l /dev/nvidia* 2>&1"),
        "nvidia driver libraries": sh("ldconfig -p | grep -E 'libcuda.so|libnvidia-ml.so' ; ls /usr/local/nvidia 2>&1"),
        "nvidia-smi": sh("nvidia-smi -L 2>&1"),
        "python": sh(f"{sys.executable} -c 'import sys; print(sys.version, sys.prefix, sys.base_prefix)'"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpojob_testing.gpu_node", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    pack_command = commands.add_parser("pack", help="write the parts (here)")
    pack_command.add_argument("out", type=Path)
    unpack_command = commands.add_parser("unpack", help="extract and install the parts (there)")
    unpack_command.add_argument("parts", type=Path)
    unpack_command.add_argument("--site-packages", type=Path, default=Path("/tmp/site-packages"))
    merge_command = commands.add_parser("merge", help="move installed wheels into site-packages, bin/ script by script")
    merge_command.add_argument("source", type=Path)
    merge_command.add_argument("--site-packages", type=Path, default=Path("/tmp/site-packages"))
    commands.add_parser("capabilities", help="what this machine's kernel allows a real node")
    args = parser.parse_args(argv)
    if args.command == "pack":
        summary = pack(args.out)
        mib = {key: f"{summary[key] / 2**20:.1f} MiB" for key in ("raw_bytes", "compressed_bytes")}
        print(json.dumps({**summary, **mib}, indent=2))
    elif args.command == "unpack":
        unpack(args.parts, args.site_packages)
    elif args.command == "merge":
        merge_site_packages(args.source, args.site_packages)
    else:
        for key, value in capabilities().items():
            print(f"== {key}\n{value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
