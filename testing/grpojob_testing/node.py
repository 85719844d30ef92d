"""A real Kubernetes node for the test control plane: containerd + runc, the kubelet, CNI (bridge,
host-local, portmap), kube-proxy (iptables) and CoreDNS, all running as host processes.

Opt-in (`cluster up --real-node`): it needs root, and it changes the host in ways `down` undoes: an
address on ``lo`` (the node's IP, which pods reach through the bridge), a bridge, iptables rules,
mounts and network namespaces under the cluster's state directory, and two sysctls. One real node
per machine, since the bridge, the node address and the ``kubepods`` cgroups are host-wide.

Runtime choice: Debian bookworm's containerd 1.6 and runc 1.1 (pinned with the CNI plugins and
iptables in testing/node-packages.txt, installed by `make node-packages`). Kubelet 1.34
still speaks CRI v1 to containerd 1.6 (it only logs that the runtime cannot report its cgroup driver
and uses the configured one), so building containerd 2 from the Go module proxy buys nothing yet; it
will when Kubernetes drops containerd 1.x.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from grpojob_testing import node_images, pki

NODE_NAME = "grpojob-node"
# The node's address lives on the host's loopback interface as a /32, so it needs no free network:
# pods reach it through their bridge gateway, and the host reaches it locally.
NODE_IP = "10.249.0.1"
POD_SUBNET = "10.245.0.0/24"
BRIDGE = "grpojob0"
DNS_SERVICE_IP = "10.96.0.10"
CNI_BIN_DIR = Path("/usr/lib/cni")
NODE_ROLE = "real"
# Host-wide switches the node needs; `down` restores the values it found.
SYSCTLS = {"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"}
NODE_PACKAGES_FILE = Path(__file__).resolve().parent.parent / "node-packages.txt"


@dataclass(frozen=True)
class NodePaths:
    """Every file and directory of the node, under ``<cluster state dir>/node``."""

    root: Path

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd" / "state"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd" / "config.toml"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def images_dir(self) -> Path:
        return self.root / "images"


def containerd_config(paths: NodePaths) -> str:
    """containerd 1.6's config (version 2): its own root, state and socket, runc with cgroupfs, our
    pause image as the sandbox image, CNI from Debian's plugin directory and our conflist, network
    namespaces under the state directory (so `down` finds them)."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{paths.containerd_root}"
state = "{paths.containerd_state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "{paths.containerd_socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{paths.root / "containerd" / "opt"}"

[{cri}]
  sandbox_image = "{node_images.PAUSE_IMAGE}"
  netns_mounts_under_state_dir = true
  # No CAP_SYS_RESOURCE on machines like the CI VM: runc may not lower a process's oom_score_adj
  # below containerd's own (the sandbox asks for -998), so containerd clamps it.
  restrict_oom_score_adj = true
  enable_selinux = false

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{paths.cni_conf_dir}"
"""


def cni_conflist(paths: NodePaths) -> dict[str, Any]:
    """One bridge network (hairpin on, so a pod reaches itself through a Service) with host-local
    addresses kept under the state directory, and portmap for hostPort."""
    gateway = str(next(ipaddress.ip_network(POD_SUBNET).hosts()))
    return {
        "cniVersion": "1.0.0",
        "name": "grpojob",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(paths.root / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(paths: NodePaths, ca_cert: Path, ports: dict[str, int]) -> dict[str, Any]:
    """KubeletConfiguration: cgroupfs on cgroup v1, x509 client auth from the cluster CA, cluster
    DNS at the kube-dns Service, and no image GC or disk eviction (the pause image cannot be pulled
    back)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": ports["kubelet"],
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports["kubelet-healthz"],
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca_cert)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "clusterDomain": "cluster.local",
        "clusterDNS": [DNS_SERVICE_IP],
        "resolvConf": "/etc/resolv.conf",
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # Absolute and small: under disk pressure the kubelet deletes every image no container uses, and
        # neither ours nor the pause image can be pulled back (containerd 1.6 cannot pin images).
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "512Mi", "imagefs.available": "512Mi"},
        "serializeImagePulls": False,
        "maxPods": 110,
        "podLogsDir": str(paths.root / "pod-logs"),
    }


def kube_proxy_config(kubeconfig: Path, ports: dict[str, int]) -> dict[str, Any]:
    """KubeProxyConfiguration: iptables mode, no host-wide sysctls beyond the node's own."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "mode": "iptables",
        "clusterCIDR": POD_SUBNET,
        "healthzBindAddress": f"127.0.0.1:{ports['kube-proxy']}",
        "metricsBindAddress": f"127.0.0.1:{ports['kube-proxy-metrics']}",
        "conntrack": {"maxPerCore": 0},
        "iptables": {"localhostNodePorts": False},
    }


def corefile(kubeconfig: Path, ports: dict[str, int]) -> str:
    """CoreDNS answers for the cluster domain from the API and forwards the rest to the host's
    resolver, on the node address (port 53) where the kube-dns Service points."""
    return f""".:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:{ports["coredns-health"]}
    ready 127.0.0.1:{ports["coredns"]}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} grpojob-test
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 30
    forward . /etc/resolv.conf
}}
"""


def dns_objects() -> list[dict[str, Any]]:
    """The kube-dns Service (selector-less) and its EndpointSlice pointing at CoreDNS on the node."""
    labels = {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}
    ports = [("dns", "UDP"), ("dns-tcp", "TCP")]
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
            "spec": {
                "clusterIP": DNS_SERVICE_IP,
                "ports": [{"name": name, "protocol": protocol, "port": 53} for name, protocol in ports],
            },
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "kube-dns-node",
                "namespace": "kube-system",
                "labels": {
                    "kubernetes.io/service-name": "kube-dns",
                    "endpointslice.kubernetes.io/managed-by": "grpojob-testing",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
            "ports": [{"name": name, "protocol": protocol, "port": 53} for name, protocol in ports],
        },
    ]


def write_kubeconfig(path: Path, server: str, p: pki.Pki, cert: Path, key: Path) -> Path:
    """A kubeconfig for one client certificate of the cluster's PKI (context ``grpojob-test``)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "grpojob-test", "cluster": {"server": server, "certificate-authority": str(p.ca_cert)}}],
        "users": [{"name": "user", "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "grpojob-test", "context": {"cluster": "grpojob-test", "user": "user"}}],
        "current-context": "grpojob-test",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def write_configs(paths: NodePaths, server: str, p: pki.Pki, ports: dict[str, int]) -> dict[str, Path]:
    """Write every config file of the node; return them by program name."""
    for directory in (paths.cni_conf_dir, paths.kubelet_dir, paths.images_dir, paths.containerd_config.parent):
        directory.mkdir(parents=True, exist_ok=True)
    paths.containerd_config.write_text(containerd_config(paths))
    (paths.cni_conf_dir / "10-grpojob.conflist").write_text(json.dumps(cni_conflist(paths), indent=2))
    kubelet_kubeconfig = write_kubeconfig(
        paths.root / "kubelet.kubeconfig",
        server,
        p,
        *pki.client_cert(p, "kubelet", f"system:node:{NODE_NAME}", "system:nodes"),
    )
    proxy_kubeconfig = write_kubeconfig(
        paths.root / "kube-proxy.kubeconfig", server, p, *pki.client_cert(p, "kube-proxy", "system:kube-proxy")
    )
    files = {
        "containerd": paths.containerd_config,
        "kubelet": paths.root / "kubelet.yaml",
        "kubelet-kubeconfig": kubelet_kubeconfig,
        "kube-proxy": paths.root / "kube-proxy.yaml",
        "coredns": paths.root / "Corefile",
    }
    files["kubelet"].write_text(yaml.safe_dump(kubelet_config(paths, p.ca_cert, ports)))
    files["kube-proxy"].write_text(yaml.safe_dump(kube_proxy_config(proxy_kubeconfig, ports)))
    # CoreDNS reads Services, EndpointSlices and Namespaces cluster-wide: the admin identity will do.
    files["coredns"].write_text(corefile(paths.root.parent / "kubeconfig", ports))
    return files


def debian_packages() -> dict[str, str]:
    """The pinned Debian packages of the node: name to exact version."""
    lines = [line.strip() for line in NODE_PACKAGES_FILE.read_text().splitlines()]
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def preflight() -> None:
    """Fail with what to do when the node cannot start here: not root, or packages not as pinned."""
    if os.geteuid() != 0:
        raise RuntimeError("a real node needs root (it runs containerd and the kubelet)")
    wrong = []
    for name, version in debian_packages().items():
        found = run("dpkg-query", "-W", "-f", "${Version}", name, check=False).stdout
        if found != version:
            wrong.append(f"{name} {found or 'missing'} (pinned {version})")
    if wrong:
        raise RuntimeError(f"run `make node-packages`: {', '.join(wrong)}")


# -- host changes ---------------------------------------------------------------------------------


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a host command, capturing its output."""
    return subprocess.run(args, capture_output=True, text=True, check=check)


def set_sysctls() -> dict[str, str]:
    """Switch on what the node needs; return the values found before (for `restore_sysctls`)."""
    previous = {}
    for key, value in SYSCTLS.items():
        path = Path("/proc/sys") / key
        previous[key] = path.read_text().strip()
        path.write_text(value)
    return previous


def restore_sysctls(previous: dict[str, str]) -> None:
    """Put back the sysctl values `set_sysctls` found."""
    for key, value in previous.items():
        (Path("/proc/sys") / key).write_text(value)


def add_node_address() -> None:
    """Put the node address on ``lo``; refuse if it is there already (another real node runs)."""
    if NODE_IP in run("ip", "-4", "addr", "show", "dev", "lo").stdout:
        raise RuntimeError(f"{NODE_IP} is already on lo: another real test node runs on this machine")
    run("ip", "addr", "add", f"{NODE_IP}/32", "dev", "lo")


def kill_containers(ctr: list[str]) -> None:
    """SIGKILL every container task of the kubelet's namespace and delete it, so the shims exit."""
    tasks = run(*ctr, "tasks", "ls", "-q", check=False).stdout.split()
    for task in tasks:
        run(*ctr, "tasks", "kill", "-s", "SIGKILL", task, check=False)
    deadline = time.monotonic() + 15
    for task in tasks:
        while run(*ctr, "tasks", "delete", task, check=False).returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.2)


def kill_shims(containerd_socket: Path) -> None:
    """SIGKILL any containerd shim still serving our containerd (found by its -address argument)."""
    needle = str(containerd_socket).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"containerd-shim" in cmdline and needle in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


def unmount_under(directory: Path) -> None:
    """Lazily unmount every mount point below ``directory``, deepest first."""
    prefix = str(directory.resolve()) + "/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix):
            points.append(point)
    for point in sorted(set(points), key=len, reverse=True):
        run("umount", "-l", point, check=False)


def remove_iptables_chains(prefixes: tuple[str, ...] = ("KUBE-", "CNI-")) -> None:
    """Delete the rules that jump to chains named ``prefixes*`` and those chains: what kube-proxy's
    own cleanup leaves (the kubelet's canary and firewall chains) and what portmap and bridge add."""
    for program in ("iptables", "ip6tables"):
        for table in ("nat", "filter", "mangle"):
            rules = run(program, "-t", table, "-S", check=False).stdout.splitlines()
            chains = [r.split()[1] for r in rules if r.startswith("-N ") and r.split()[1].startswith(prefixes)]
            for rule in rules:
                parts = shlex.split(rule)
                jumps = any(f"-j {chain}" in rule for chain in chains)
                if parts[0] == "-A" and not parts[1].startswith(prefixes) and jumps:
                    run(program, "-t", table, "-D", *parts[1:], check=False)
            for chain in chains:
                run(program, "-t", table, "-F", chain, check=False)
            for chain in chains:
                run(program, "-t", table, "-X", chain, check=False)


def remove_cgroups(name: str = "kubepods") -> None:
    """Remove the kubelet's (empty by now) cgroup trees from every cgroup v1 hierarchy."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        top = hierarchy / name
        if not top.is_dir():
            continue
        for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def clean_host(paths: NodePaths, kube_proxy: Path | None, previous_sysctls: dict[str, str]) -> None:
    """Undo every host change of the node; safe to run twice and after a partial start."""
    kill_shims(paths.containerd_socket)
    unmount_under(paths.root)
    if kube_proxy is not None and kube_proxy.exists():
        run(str(kube_proxy), "--cleanup", check=False)
    remove_iptables_chains()
    run("ip", "link", "delete", BRIDGE, check=False)
    run("ip", "addr", "del", f"{NODE_IP}/32", "dev", "lo", check=False)
    remove_cgroups()
    restore_sysctls(previous_sysctls)
