"""A real Kubernetes control plane on loopback, with the KubeRay operator and kwok's fake GPU nodes.

    python -m grpojob_testing.cluster up            # build if needed, start, print the kubeconfig path
    python -m grpojob_testing.cluster up --real-node --cpu-nodes 0 --gpu-nodes 0   # and a real node
    python -m grpojob_testing.cluster up --real-node --cpu-nodes 0 --gpu-nodes 0 --no-kwok --gpus
                                                    # a real GPU node: its GPUs as nvidia.com/gpu
    python -m grpojob_testing.cluster kubeconfig    # print the kubeconfig path of a running cluster
    python -m grpojob_testing.cluster status        # which processes run, on which ports
    python -m grpojob_testing.cluster down          # stop every process and delete the state

Processes: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, the KubeRay operator and
kwok, each started from the programs `grpojob_testing.build` made from pinned sources, with flags
close to those of controller-runtime's envtest and kwokctl's binary runtime. A cluster lives in a
state directory (``--name`` picks one under ~/.cache/grpojob/clusters/) holding its certificates,
kubeconfig, etcd data, logs and ``cluster.json`` (ports and process ids), so `down` from another
shell finds and stops everything `up` started.

With ``--real-node`` (root only) the cluster also gets a real node, ``grpojob-node``: containerd,
the kubelet, kube-proxy and CoreDNS (see `grpojob_testing.node`); the apiserver then listens on the
node address too, so pods reach it through the ``kubernetes`` Service. With ``--gpus`` the node's
GPUs (``/dev/nvidia0``, ...) are advertised as ``nvidia.com/gpu`` by our device plugin
(testing/go/device-plugin), a process of the cluster like the kubelet (`make e2e-gpu`).
"""

from __future__ import annotations

import argparse
import base64
import glob
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from grpojob_testing import build, kuberay, kueue, node, node_images, nodes, pki
from grpojob_trainer.net.loopback import free_ports, wait_until_healthy

SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
POD_CIDR = "10.244.0.1/16"
CLUSTER_DOMAIN = "cluster.local"
KUBERAY_CRDS = ("rayclusters.ray.io", "rayjobs.ray.io")
PROCESS_ORDER = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "kuberay-operator",
    "kueue",
    "containerd",
    "kubelet",
    "device-plugin",
    "kube-proxy",
    "coredns",
)
# Node lifecycles are kwok's own stage definitions, shipped in its module (nodes become Ready at once
# and renew their lease, as kwokctl configures them); pod lifecycles are ours (see the file).
KWOK_NODE_STAGES = ("kustomize/stage/node/fast", "kustomize/stage/node/heartbeat-with-lease")
KWOK_POD_STAGES = Path(__file__).resolve().parent.parent / "kwok" / "pod-stages.yaml"
KWOK_POD_PARALLELISM = 16
"""Pods whose stages kwok plays at once (its default: 4). A real cluster starts pods on each node's kubelet in
parallel; at 4, kwok's fake kubelets for all nodes turned 100 jobs' pods Ready one after the other (heads 6 s
late at 100 jobs in `benchmarks/operator_scale.py`), whichever controller had created them."""
KWOK_LEASE_PARALLELISM = 16
"""Node leases kwok renews at once (its default: 4). At 4, with 728 fake nodes on 2 loaded cores, renewals fell
behind the node controller's grace period: 273 nodes went NotReady for a while in the 1,000-job benchmark and
their 400 pods were marked not Ready."""
KWOK_CONFIGURATION = """\
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: {pod_parallelism}
  nodePlayStageParallelism: 4
  nodeLeaseParallelism: {lease_parallelism}
  podsOnNodeSyncParallelism: 1
  enablePodsOnNodeSyncListPager: true
  enableDebuggingHandlers: true
  enableProfilingHandler: true
"""
"""kwok's options: its defaults (v0.8.0, `zz_generated.defaults.go`), which a configuration given in a file
replaces rather than fills in, but for the pods' and the node leases' parallelism."""
OPTIONAL_COMPONENTS = ("kueue",)
"""Programs a cluster runs without when they could not be built here (the tests that need them skip);
`make cluster-binaries` (CI) builds every program and fails on any."""
NOT_RUN_BY_A_CLUSTER = ("kind", "local-path-provisioner")
"""Programs of versions.toml that `up` does not build: the kind suite's (`make cluster-binaries` builds them).
A GPU machine gets only the programs a cluster runs (`grpojob_testing.gpu_node`)."""
GPU_RESOURCE = "nvidia.com/gpu"
NVIDIA_DEVICE_GLOB = "/dev/nvidia[0-9]*"


def clusters_root() -> Path:
    return build.cache_root() / "clusters"


def wait_until(check: Callable[[], bool], what: str, timeout: float, interval: float = 0.25) -> None:
    """Poll ``check`` until it is true; raise TimeoutError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def abandoned_real_node_clusters(root: Path) -> list[Path]:
    """State directories under ``root`` of pytest sessions' clusters (`pytest-<pid>`) that hold a real node
    although their pytest is gone (killed before its teardown): a real node exists once per host, so one
    left behind (its address on lo, its iptables chains, its kubelet) breaks every later real node."""
    abandoned = []
    for state_dir in sorted(root.glob("pytest-*")):
        owner = state_dir.name.removeprefix("pytest-").split("-")[0]  # pytest-<pid>[-<what>]
        state_file = state_dir / "cluster.json"
        if not owner.isdigit() or process_alive(int(owner)) or not state_file.is_file():
            continue
        if json.loads(state_file.read_text()).get("real_node") is not None:
            abandoned.append(state_dir)
    return abandoned


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass
class Cluster:
    """One control plane and its state directory. `up` starts it; `down` stops it and cleans up."""

    state_dir: Path
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    # Present when the cluster has a real node: the host sysctl values to restore at `down`.
    real_node: dict[str, str] | None = None
    _children: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)

    @classmethod
    def named(cls, name: str = "default") -> Cluster:
        cluster = cls(clusters_root() / name)
        cluster.load()
        return cluster

    # -- paths --------------------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "cluster.json"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def pki(self) -> pki.Pki:
        return pki.Pki(self.state_dir / "pki")

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"

    # -- state --------------------------------------------------------------------------------

    def load(self) -> None:
        if self.state_file.exists():
            state = json.loads(self.state_file.read_text())
            self.ports, self.pids = state["ports"], state["pids"]
            self.real_node = state.get("real_node")

    def save(self) -> None:
        state = {"ports": self.ports, "pids": self.pids, "real_node": self.real_node}
        self.state_file.write_text(json.dumps(state, indent=2))

    def running(self) -> dict[str, bool]:
        return {name: process_alive(pid) for name, pid in self.pids.items()}

    # -- lifecycle ----------------------------------------------------------------------------

    def up(
        self,
        *,
        cpu_nodes: int = 2,
        gpu_nodes: int = 4,
        real_node: bool = False,
        kwok: bool = True,
        gpu_device_glob: str | None = None,
        log=sys.stderr,
    ) -> Path:
        """Build what is missing, start every process, install the KubeRay CRDs and the fake nodes,
        and with ``real_node`` the real node. Without ``kwok`` there are no fake nodes (a machine without
        Go: kwok's stages are read from its module's source). With ``gpu_device_glob`` (real node only) the
        device plugin advertises each matching device node as one ``nvidia.com/gpu``.

        Returns the admin kubeconfig. On any failure the processes already started are stopped.
        """
        if real_node:
            node.preflight()
            for state_dir in abandoned_real_node_clusters(clusters_root()):
                print(f"tearing down the real node of {state_dir.name}, whose pytest is gone", file=log)
                Cluster(state_dir).down()
        self.load()
        if self.pids and any(self.running().values()):
            raise RuntimeError(f"a cluster already runs from {self.state_dir}; run `down` first")
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.log_dir.mkdir(parents=True)
        self.pids, self.ports, self.real_node = {}, {}, None
        if gpu_device_glob is not None and not real_node:
            raise ValueError("GPUs are advertised by the real node's kubelet: pass real_node too")
        if not kwok and cpu_nodes + gpu_nodes:
            raise ValueError("fake nodes are kwok's: ask for none without kwok")
        components = build.load_components()
        skipped = {*NOT_RUN_BY_A_CLUSTER, *(() if kwok else ("kwok",))}
        skipped |= set() if gpu_device_glob is not None else {"device-plugin"}
        bins = {}
        for name, component in components.items():
            if name in skipped:
                continue
            try:
                bins[name] = build.build(component, log)
            except (subprocess.CalledProcessError, RuntimeError, OSError) as error:
                if name not in OPTIONAL_COMPONENTS:
                    raise
                print(f"{name} could not be built, so the cluster runs without it: {error}", file=log)
        started = time.monotonic()
        try:
            if real_node:
                self.real_node = node.set_sysctls()
                self.save()
                node.add_node_address()
            self._start_control_plane(bins)
            self._install_kuberay(bins["kuberay"], components["kuberay"])
            if "kueue" in bins:
                self._start_kueue(bins["kueue"])
            if kwok:
                self._start_kwok(bins["kwok"], components["kwok"])
            if cpu_nodes + gpu_nodes:
                self.apply_objects(nodes.fake_nodes(cpu_nodes, gpu_nodes))
                self._wait_nodes_ready(cpu_nodes + gpu_nodes)
            if real_node:
                self._start_real_node(bins)
            if gpu_device_glob is not None:
                self._start_device_plugin(bins["device-plugin"], gpu_device_glob)
            self._wait_default_service_account()
        except BaseException:
            self.down(keep_logs=True)
            raise
        print(f"cluster up in {time.monotonic() - started:.1f}s; kubeconfig: {self.kubeconfig}", file=log)
        return self.kubeconfig

    def down(self, *, keep_logs: bool = False) -> None:
        """Stop every process `up` started (SIGTERM, then SIGKILL) and remove the state directory."""
        self.load()
        paths = node.NodePaths(self.state_dir / "node")
        for name in reversed([n for n in PROCESS_ORDER if n in self.pids]):
            if name == "containerd" and process_alive(self.pids[name]):
                node.kill_containers(self._ctr(paths))
            self._stop(name, self.pids[name])
        self.pids = {}
        if self.real_node is not None:
            kube_proxy = build.load_components()["kubernetes"].bin_dir / "kube-proxy"
            node.clean_host(paths, kube_proxy, self.real_node)
            self.real_node = None
        if keep_logs:
            for path in self.state_dir.iterdir() if self.state_dir.exists() else []:
                if path != self.log_dir:
                    shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink()
        else:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def _stop(self, name: str, pid: int) -> None:
        child = self._children.pop(name, None)
        for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            if child is not None:
                try:
                    child.wait(grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            try:
                wait_until(lambda: not process_alive(pid), f"{name} (pid {pid}) to exit", grace, 0.1)
                break
            except TimeoutError:
                continue

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        log_file = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it open
        child = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        log_file.close()
        self._children[name] = child
        self.pids[name] = child.pid
        self.save()

    def _wait_healthy(self, name: str, url: str, timeout: float = 120.0, client_cert: bool = False) -> None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        if client_cert:
            context.load_cert_chain(self.pki.admin_cert, self.pki.admin_key)

        def running() -> None:
            if not process_alive(self.pids[name]):
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited during start-up; end of its log:\n{tail}")

        wait_until_healthy(url, timeout, check=running, context=context)

    def _choose_ports(self, *names: str) -> None:
        """Free ports for the servers ``names``, chosen together: one chosen alone may be another's that has not
        started listening yet."""
        self.ports.update(zip(names, free_ports(len(names)), strict=True))

    def _start_control_plane(self, bins: dict[str, Path]) -> None:
        k8s = bins["kubernetes"]
        self._choose_ports("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
        p = pki.generate(
            self.state_dir / "pki",
            KUBERNETES_SERVICE_IP,
            ["kubernetes", "kubernetes.default", "kubernetes.default.svc", f"kubernetes.default.svc.{CLUSTER_DOMAIN}"],
            extra_ips=(node.NODE_IP,) if self.real_node is not None else (),
        )
        self._write_kubeconfig()

        etcd_url = f"http://127.0.0.1:{self.ports['etcd']}"
        peer_url = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        self._spawn(
            "etcd",
            [
                str(bins["etcd"] / "etcd"),
                "--name=default",
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
        )
        self._wait_healthy("etcd", f"{etcd_url}/health")

        if self.real_node is None:
            addresses = ["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--authorization-mode=RBAC"]
        else:
            # Pods reach the apiserver through the `kubernetes` Service, whose endpoint is the advertised
            # node address; the kubelet is authorised by the Node authorizer and serves logs to the admin.
            addresses = [
                "--bind-address=0.0.0.0",
                f"--advertise-address={node.NODE_IP}",
                "--authorization-mode=Node,RBAC",
                f"--kubelet-client-certificate={p.admin_cert}",
                f"--kubelet-client-key={p.admin_key}",
                "--kubelet-preferred-address-types=InternalIP",
                # MutatingAdmissionPolicy (beta, off by default in 1.34): tests/e2e shrink pod requests to
                # fit the real node, which has the machine's few cores.
                "--feature-gates=MutatingAdmissionPolicy=true",
                "--runtime-config=admissionregistration.k8s.io/v1beta1=true",
            ]
        self._spawn(
            "kube-apiserver",
            [
                str(k8s / "kube-apiserver"),
                *addresses,
                f"--secure-port={self.ports['kube-apiserver']}",
                f"--etcd-servers={etcd_url}",
                f"--cert-dir={self.state_dir / 'apiserver'}",
                f"--tls-cert-file={p.serving_cert}",
                f"--tls-private-key-file={p.serving_key}",
                f"--client-ca-file={p.ca_cert}",
                f"--service-account-issuer=https://kubernetes.default.svc.{CLUSTER_DOMAIN}",
                f"--service-account-key-file={p.service_account_pub}",
                f"--service-account-signing-key-file={p.service_account_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--enable-admission-plugins=ExtendedResourceToleration",
                "--allow-privileged=true",
                "--v=1",
            ],
        )
        self._wait_healthy("kube-apiserver", f"{self.server}/readyz", client_cert=True)

        common = [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            "--v=1",
        ]
        self._spawn(
            "kube-controller-manager",
            [
                str(k8s / "kube-controller-manager"),
                *common,
                f"--secure-port={self.ports['kube-controller-manager']}",
                f"--service-account-private-key-file={p.service_account_key}",
                f"--root-ca-file={p.ca_cert}",
                f"--cluster-signing-cert-file={p.ca_cert}",
                f"--cluster-signing-key-file={p.ca_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [str(k8s / "kube-scheduler"), *common, f"--secure-port={self.ports['kube-scheduler']}"],
        )
        for name in ("kube-controller-manager", "kube-scheduler"):
            self._wait_healthy(name, f"https://127.0.0.1:{self.ports[name]}/healthz")

    def _install_kuberay(self, kuberay_bin: Path, component: build.Component) -> None:
        crds = kuberay_bin / "crds"
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))

        # Not `kubectl wait`: it fails instead of waiting while a new CRD has no conditions yet.
        def established() -> bool:
            jsonpath = "{range .items[*]}{.status.conditions[?(@.type=='Established')].status} {end}"
            out = self.kubectl("get", "crd", *KUBERAY_CRDS, "-o", f"jsonpath={jsonpath}", check=False)
            return out.split() == ["True"] * len(KUBERAY_CRDS)

        wait_until(established, "the KubeRay CRDs to be established", 60)
        self._choose_ports("kuberay-operator", "kuberay-metrics")
        self._spawn(
            "kuberay-operator",
            [
                str(kuberay_bin / "ray-operator"),
                *kuberay.operator_args(
                    f"127.0.0.1:{self.ports['kuberay-operator']}", f"127.0.0.1:{self.ports['kuberay-metrics']}"
                ),
            ],
            env={"KUBECONFIG": str(self.kubeconfig)},
        )
        self._wait_healthy("kuberay-operator", f"http://127.0.0.1:{self.ports['kuberay-operator']}/readyz")

    def _start_kueue(self, kueue_bin: Path) -> None:
        """Kueue's CRDs, its namespace and certificate Secret, then Kueue itself (see `grpojob_testing.kueue`)."""
        shipped = [yaml.safe_load(path.read_text()) for path in sorted((kueue_bin / "crds").glob("*.yaml"))]
        self.apply_objects(kueue.crds(shipped))
        crds = [f"{plural}.kueue.x-k8s.io" for plural in kueue.CRDS]

        def established() -> bool:
            jsonpath = "{range .items[*]}{.status.conditions[?(@.type=='Established')].status} {end}"
            out = self.kubectl("get", "crd", *crds, "-o", f"jsonpath={jsonpath}", check=False)
            return out.split() == ["True"] * len(crds)

        wait_until(established, "the Kueue CRDs to be established", 60)
        self.apply_objects(kueue.prerequisites())
        self._choose_ports("kueue", "kueue-metrics", "kueue-webhook")
        config = self.state_dir / "kueue-config.yaml"
        ports = (self.ports["kueue"], self.ports["kueue-metrics"], self.ports["kueue-webhook"])
        config.write_text(yaml.safe_dump(kueue.config(*ports, self.state_dir / "kueue-certs")))
        self._spawn("kueue", [str(kueue_bin / "kueue"), f"--config={config}"], env={"KUBECONFIG": str(self.kubeconfig)})
        cert_dir = self.state_dir / "kueue-certs"

        def mounted() -> bool:
            """Kueue's certificate, once it has written it to its Secret, into its certDir: what the kubelet
            does for Kueue's pod, and what Kueue waits for before it reports ready."""
            args = ("get", "secret", "-n", kueue.NAMESPACE, kueue.WEBHOOK_SECRET, "-o", "jsonpath={.data}")
            data = json.loads(self.kubectl(*args, check=False) or "{}")
            if "tls.crt" not in data:
                return False
            cert_dir.mkdir(exist_ok=True)
            for key, value in data.items():
                (cert_dir / key).write_bytes(base64.b64decode(value))
            return True

        wait_until(mounted, "Kueue's certificate in its Secret", 60, 0.5)
        self._wait_healthy("kueue", f"http://127.0.0.1:{self.ports['kueue']}/readyz")

    def _start_kwok(self, kwok_bin: Path, component: build.Component) -> None:
        source = build.module_dir(component)
        documents = [
            path.read_text()
            for stage_dir in KWOK_NODE_STAGES
            for path in sorted((source / stage_dir).glob("*.yaml"))
            if path.name != "kustomization.yaml"
        ]
        documents.append(KWOK_POD_STAGES.read_text())
        documents.append(
            KWOK_CONFIGURATION.format(pod_parallelism=KWOK_POD_PARALLELISM, lease_parallelism=KWOK_LEASE_PARALLELISM)
        )
        config = self.state_dir / "kwok-stages.yaml"
        config.write_text("\n---\n".join(documents))
        self._choose_ports("kwok")
        self._spawn(
            "kwok",
            [
                str(kwok_bin / "kwok"),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={config}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={nodes.KWOK_ANNOTATION}={nodes.KWOK_ANNOTATION_VALUE}",
                f"--cidr={POD_CIDR}",
                "--node-ip=10.0.0.1",
                f"--server-address=127.0.0.1:{self.ports['kwok']}",
                "--node-lease-duration-seconds=40",
            ],
        )
        self._wait_healthy("kwok", f"http://127.0.0.1:{self.ports['kwok']}/healthz")

    def _ctr(self, paths: node.NodePaths) -> list[str]:
        return ["ctr", f"--address={paths.containerd_socket}", "--namespace=k8s.io"]

    def _start_real_node(self, bins: dict[str, Path]) -> None:
        """Start containerd (with our images imported), the kubelet, CoreDNS and kube-proxy; wait for
        the node to be Ready and for kube-proxy and CoreDNS to serve."""
        paths = node.NodePaths(self.state_dir / "node")
        self._choose_ports(
            "kubelet", "kubelet-healthz", "kube-proxy", "kube-proxy-metrics", "coredns", "coredns-health"
        )
        files = node.write_configs(paths, self.server, self.pki, self.ports)
        self._spawn("containerd", ["containerd", f"--config={files['containerd']}"])
        ctr = self._ctr(paths)
        wait_until(lambda: node.run(*ctr, "version", check=False).returncode == 0, "containerd", 30)
        for archive in node_images.write_archives(paths.images_dir).values():
            node.run(*ctr, "images", "import", str(archive))
        k8s = bins["kubernetes"]
        self._spawn(
            "kubelet",
            [
                str(k8s / "kubelet"),
                f"--config={files['kubelet']}",
                f"--kubeconfig={files['kubelet-kubeconfig']}",
                f"--root-dir={paths.kubelet_dir}",
                f"--hostname-override={node.NODE_NAME}",
                f"--node-ip={node.NODE_IP}",
                f"--node-labels={nodes.NODE_ROLE_LABEL}={node.NODE_ROLE}",
                "--v=1",
            ],
        )
        self.apply_objects(node.dns_objects())
        self._spawn("coredns", [str(bins["coredns"] / "coredns"), "-conf", str(files["coredns"])])
        self._wait_healthy("kubelet", f"http://127.0.0.1:{self.ports['kubelet-healthz']}/healthz")
        wait_until(
            lambda: self.kubectl("get", "node", node.NODE_NAME, check=False) != "", "the kubelet to register", 60
        )
        self._spawn("kube-proxy", [str(k8s / "kube-proxy"), f"--config={files['kube-proxy']}", "--v=1"])
        self._wait_healthy("kube-proxy", f"http://127.0.0.1:{self.ports['kube-proxy']}/healthz")
        self._wait_healthy("coredns", f"http://127.0.0.1:{self.ports['coredns']}/ready")
        wait_until(
            lambda: (
                self.kubectl(
                    "get", "node", node.NODE_NAME, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
                )
                == "True"
            ),
            f"{node.NODE_NAME} to be Ready",
            120,
        )

    def _start_device_plugin(self, plugin_bin: Path, device_glob: str) -> None:
        """Start the device plugin (it registers with the kubelet at its fixed socket,
        /var/lib/kubelet/device-plugins/kubelet.sock) and wait until the node's allocatable shows one
        ``nvidia.com/gpu`` per device node matching ``device_glob``."""
        expected = len(glob.glob(device_glob))
        self._spawn("device-plugin", [str(plugin_bin / "device-plugin"), f"--device-glob={device_glob}"])
        jsonpath = "{.status.allocatable.nvidia\\.com/gpu}"

        def advertised() -> bool:
            if not process_alive(self.pids["device-plugin"]):
                tail = (self.log_dir / "device-plugin.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the device plugin exited; end of its log:\n{tail}")
            found = self.kubectl("get", "node", node.NODE_NAME, "-o", f"jsonpath={jsonpath}", check=False)
            return found == str(expected)

        wait_until(advertised, f"{node.NODE_NAME} to advertise {expected} {GPU_RESOURCE}", 60, 0.5)

    def _wait_nodes_ready(self, count: int) -> None:
        def all_ready() -> bool:
            out = self.kubectl(
                "get",
                "nodes",
                "-o",
                "jsonpath={range .items[*]}{.status.conditions[?(@.type=='Ready')].status}{'\\n'}{end}",
            )
            return out.split().count("True") >= count

        wait_until(all_ready, f"{count} fake nodes to be Ready", 60)

    def _wait_default_service_account(self) -> None:
        wait_until(
            lambda: self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False) != "",
            "the default ServiceAccount",
            60,
        )

    # -- client helpers -----------------------------------------------------------------------

    def _write_kubeconfig(self) -> None:
        p = self.pki
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "grpojob-test", "cluster": {"server": self.server, "certificate-authority": str(p.ca_cert)}}
            ],
            "users": [
                {
                    "name": "grpojob-admin",
                    "user": {"client-certificate": str(p.admin_cert), "client-key": str(p.admin_key)},
                }
            ],
            "contexts": [{"name": "grpojob-test", "context": {"cluster": "grpojob-test", "user": "grpojob-admin"}}],
            "current-context": "grpojob-test",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> str:
        """Run the pinned kubectl against this cluster; return its stdout."""
        kubectl = build.load_components()["kubernetes"].bin_dir / "kubectl"
        result = subprocess.run(
            [str(kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout if result.returncode == 0 else ""

    def apply_objects(self, objects: list[dict]) -> None:
        """Server-side apply a list of objects."""
        self.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(objects))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpojob_testing.cluster", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["up", "down", "kubeconfig", "status"])
    parser.add_argument("--name", default="default", help="which cluster (a state directory under the cache)")
    parser.add_argument("--cpu-nodes", type=int, default=2)
    parser.add_argument("--gpu-nodes", type=int, default=4)
    parser.add_argument("--real-node", action="store_true", help="also start a real node (root; see the node module)")
    parser.add_argument("--no-kwok", dest="kwok", action="store_false", help="no kwok (and so no fake nodes)")
    parser.add_argument(
        "--gpus",
        nargs="?",
        const=NVIDIA_DEVICE_GLOB,
        metavar="DEVICE_GLOB",
        help=f"advertise the real node's GPUs as {GPU_RESOURCE}, one per device node (default {NVIDIA_DEVICE_GLOB})",
    )
    args = parser.parse_args(argv)
    cluster = Cluster.named(args.name)
    if args.command == "up":
        print(
            cluster.up(
                cpu_nodes=args.cpu_nodes,
                gpu_nodes=args.gpu_nodes,
                real_node=args.real_node,
                kwok=args.kwok,
                gpu_device_glob=args.gpus,
            )
        )
    elif args.command == "down":
        cluster.down()
    elif args.command == "kubeconfig":
        if not cluster.pids or not all(cluster.running().values()):
            print(f"no running cluster in {cluster.state_dir}", file=sys.stderr)
            return 1
        print(cluster.kubeconfig)
    else:
        for name, alive in cluster.running().items():
            print(f"{name:26} pid {cluster.pids[name]:>7}  {'running' if alive else 'gone'}")
        for name, port in cluster.ports.items():
            print(f"{name:26} port {port}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
