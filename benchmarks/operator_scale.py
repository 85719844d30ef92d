"""Operator scale (issue 3, part 4): GRPOJobs against KubeRay's own RayJob controller, same cluster, same run.

    .venv/bin/python benchmarks/operator_scale.py            # 1, 10 and 100 jobs; writes docs/benchmarks.md
    .venv/bin/python benchmarks/operator_scale.py --quick    # 1 and 3 jobs; prints the table only

One fresh control plane (`grpojob_testing.cluster`, name `bench`: etcd, kube-apiserver, controller-manager,
scheduler, KubeRay at the version `testing/versions.toml` pins, kwok with fake 8-GPU nodes). For each count N,
two batches, each in its own namespace, deleted (and waited for) before the next:

* GRPOJob: a fresh `python -m grpojob_operator --namespace NS` (production settings) and N GRPOJobs created
  at once. Milestones: the RayCluster's HeadPodReady condition, ConfigMap `J-endpoints` created, Job
  `J-trainer` created.
* RayJob (the anchor): KubeRay restarted (so its memory high-water mark is this batch's) and N RayJobs in
  K8sJobMode with the same RayCluster shape, created at once. KubeRay (v1.5.0 when this was read; the tests
  run v1.6.1) waits for the RayCluster's `.status.state == ready` (head *and* workers running), then creates
  the submitter Job (named like the RayJob) and only then writes `JobDeploymentStatus: Running`
  (rayjob_controller.go, Initializing case).
  Milestones: HeadPodReady, state ready, submitter Job created.

Times are client-side: `time.monotonic()` just before each create request, and when this process's watch
sees the milestone (creationTimestamps have 1 s resolution). Writes are counted four ways over the window
from the first create to `--settle-seconds` after the last milestone: the operator's own
`grpojob_api_writes_total`; every write of the operator process, Kopf's included, counted by wrapping its two
HTTP clients (aiohttp for Kopf, urllib3 via the kubernetes client for ours) in this script's launcher;
KubeRay's `rest_client_requests_total`; and the kube-apiserver's `apiserver_request_total` by resource.
Memory is VmHWM (and the peak of VmRSS sampled every 0.2 s) from /proc/<pid>/status.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shlex
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parent.parent
CRD_DIR = REPO / "charts" / "grpojob" / "crds"
DOC = REPO / "docs" / "benchmarks.md"
SECTION = "## Operator scale (issue 3)"
CLUSTER_NAME = "bench"
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY", "DELETECOLLECTION"})
JOB_LABEL = "grpo.dev/job"
BACKGROUND = frozenset({"leases", "nodes", "nodes/status"})  # kwok's node heartbeats, not the jobs' work
RAYJOB_LABEL = "ray.io/originated-from-cr-name"  # KubeRay's label on a RayJob's RayCluster and submitter Job
GRPOJOB, RAYJOB = "GRPOJob", "RayJob"

# Milestones, per kind: (key, what it means).
MILESTONES = {
    GRPOJOB: (
        ("cluster", "RayCluster created"),
        ("head", "RayCluster HeadPodReady seen"),
        ("gate", "ConfigMap J-endpoints created"),
        ("job", "Job J-trainer created"),
    ),
    RAYJOB: (
        ("cluster", "RayCluster created"),
        ("head", "RayCluster HeadPodReady seen"),
        ("gate", "RayCluster .status.state ready"),
        ("job", "submitter Job created"),
    ),
}
RAY_PODS_PER_JOB = 3  # head, one `generation` and one `policy` worker: both manifests below
TRACE = (
    ("headpod", "head pod Ready with an IP (kwok, as the pod watch sees it)"),
    ("placed", f"all {RAY_PODS_PER_JOB} Ray pods bound to a node"),
)
"""Milestones of the pods themselves, the same for both kinds: where the time between the head and the gate
goes. Not waited for (a batch ends on `MILESTONES`)."""


# ------------------------------------------------------------------------------------------------
# the operator launcher: `operator_scale.py --serve-operator NS` is the operator process itself


def resource_of(url: str) -> str:
    """`/apis/ray.io/v1/namespaces/n/rayclusters/x/status` → `rayclusters/status`."""
    parts = urlparse(url).path.strip("/").split("/")
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    if not rest:
        return "?"
    return rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")


def serve_operator(namespace: str) -> None:
    """Run `python -m grpojob_operator --namespace NS` in this process, with every write request counted
    in `bench_operator_writes_total{client,verb,resource}` on the operator's own metrics endpoint: `kopf`
    for Kopf's aiohttp session (nothing since issue 15; before, its finalizer and Events), `grpojob` for the
    kubernetes client the operator writes children, status and Events with. Nothing else changes."""
    import aiohttp
    from kubernetes.client import rest
    from prometheus_client import Counter as PromCounter

    writes = PromCounter(
        "bench_operator_writes", "write requests of the operator process", ["client", "verb", "resource"]
    )
    aiohttp_request = aiohttp.ClientSession.request
    urllib3_request = rest.RESTClientObject.request

    def counted_aiohttp(self: Any, method: str, url: Any, *args: Any, **kwargs: Any) -> Any:
        if method.upper() in WRITE_VERBS:
            writes.labels("kopf", method.upper(), resource_of(str(url))).inc()
        return aiohttp_request(self, method, url, *args, **kwargs)

    def counted_urllib3(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method.upper() in WRITE_VERBS:
            writes.labels("grpojob", method.upper(), resource_of(url)).inc()
        return urllib3_request(self, method, url, *args, **kwargs)

    aiohttp.ClientSession.request = counted_aiohttp
    rest.RESTClientObject.request = counted_urllib3

    from grpojob_operator.__main__ import main

    main(["--namespace", namespace])


# ------------------------------------------------------------------------------------------------
# measuring helpers


def proc_memory(pid: int) -> dict[str, int]:
    """VmHWM and VmRSS of a process, in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = int(value.split()[0])
    return out


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, in seconds (/proc/<pid>/stat utime and stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RssSampler:
    """Peak VmRSS of some processes, sampled every 0.2 s in a thread."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids, self.peak = pids, dict.fromkeys(pids, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                with contextlib.suppress(FileNotFoundError, ProcessLookupError, KeyError):
                    self.peak[name] = max(self.peak[name], proc_memory(pid)["VmRSS"])
            self._stop.wait(0.2)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)


def scrape(url: str, context: ssl.SSLContext | None = None) -> Counter:
    """Prometheus samples of a /metrics endpoint as {(name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=30, context=context) as response:
        text = response.read().decode()
    samples: Counter = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] += sample.value
    return samples


def select(samples: Counter, name: str, **where: Callable[[str], bool] | str) -> Counter:
    """Samples named `name` whose labels match, keyed by their label dict as a tuple."""
    out: Counter = Counter()
    for (sample, labels), value in samples.items():
        if sample != name:
            continue
        values = dict(labels)
        ok = all(
            (test(values.get(key, "")) if callable(test) else values.get(key) == test) for key, test in where.items()
        )
        if ok:
            out[labels] += value
    return out


def delta(after: Counter, before: Counter) -> Counter:
    return Counter({key: after[key] - before.get(key, 0) for key in after if after[key] - before.get(key, 0)})


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# ------------------------------------------------------------------------------------------------
# watches


class Milestones:
    """First time (monotonic) each job reached each milestone, fed by watch threads."""

    def __init__(self) -> None:
        self.created: dict[str, float] = {}
        self.reached: dict[str, dict[str, float]] = defaultdict(dict)
        self.lock = threading.Lock()

    def mark(self, job: str, milestone: str, at: float) -> None:
        with self.lock:
            self.reached[job].setdefault(milestone, at)

    def done(self, jobs: Iterable[str], keys: Iterable[str]) -> int:
        with self.lock:
            return sum(1 for j in jobs if all(k in self.reached.get(j, {}) for k in keys))

    def latencies(self, milestone: str) -> list[float]:
        return [r[milestone] - self.created[j] for j, r in self.reached.items() if milestone in r and j in self.created]


class Watches:
    """Watch threads on one namespace; each calls `on_event(object as dict, monotonic time)`. A watch that the
    server ends is resumed from the last resourceVersion it saw, so no event is missed or seen late."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client
        self.stopped = threading.Event()
        self.watches: list[Any] = []
        self.restarts = 0

    def start(self, list_func: Callable[..., Any], args: tuple, on_event: Callable[[dict, float], None]) -> None:
        from kubernetes import watch

        def run() -> None:
            version = None
            while not self.stopped.is_set():
                w = watch.Watch()
                self.watches.append(w)
                try:
                    for event in w.stream(list_func, *args, **({"resource_version": version} if version else {})):
                        now = time.monotonic()
                        obj = event["object"]
                        if not isinstance(obj, dict):
                            obj = self.api_client.sanitize_for_serialization(obj)
                        version = obj["metadata"].get("resourceVersion") or version
                        on_event(obj, now)
                except Exception as error:
                    if self.stopped.is_set():
                        return
                    self.restarts += 1
                    if "410" in str(error) or "Expired" in str(error):
                        version = None  # too old: list again (objects seen again keep their first time)
                    print(f"  watch {list_func.__name__} resumed after {error!r}", file=sys.stderr, flush=True)
                    time.sleep(0.1)

        threading.Thread(target=run, daemon=True).start()

    def stop(self) -> None:
        self.stopped.set()
        for w in self.watches:
            w.stop()


def condition_true(obj: dict, kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True" for c in (obj.get("status") or {}).get("conditions", [])
    )


# ------------------------------------------------------------------------------------------------
# manifests


def grpojob_manifest(name: str) -> dict[str, Any]:
    """The integration tests' GRPOJob (tests/integration/operator/conftest.py `job_manifest`): one generation
    engine with 1 GPU, one policy worker with 2 GPUs, one environment."""
    return {
        "apiVersion": "grpo.dev/v1alpha1",
        "kind": "GRPOJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"path": "/models/tiny", "servedModelName": "tiny"},
            "dataset": {"configMap": {"name": "rows"}},
            "environments": [{"name": "digits", "command": ["python", "-m", "grpojob_trainer.environments", "digits"]}],
            "generation": {"replicas": 1, "gpusPerReplica": 1},
            "training": {"replicas": 1, "gpusPerReplica": 2},
            "backoffLimit": 1,
        },
    }


def rayjob_manifest(name: str, namespace: str) -> dict[str, Any]:
    """A RayJob in K8sJobMode whose rayClusterSpec is exactly what the operator builds for the GRPOJob above."""
    from grpojob_api.admission import parse_job
    from grpojob_operator.children.raycluster import build_raycluster
    from grpojob_operator.settings import OperatorSettings

    source = grpojob_manifest(name)
    source["metadata"].update(namespace=namespace, uid="00000000-0000-0000-0000-000000000000")
    cluster_spec = build_raycluster(parse_job(source), OperatorSettings())["spec"]
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name},
        "spec": {
            "entrypoint": "python -m grpojob_trainer.train",
            "submissionMode": "K8sJobMode",
            "shutdownAfterJobFinishes": False,
            "rayClusterSpec": cluster_spec,
        },
    }


# ------------------------------------------------------------------------------------------------
# the run


@dataclass
class Batch:
    kind: str
    count: int
    latencies: dict[str, list[float]] = field(default_factory=dict)
    trace: dict[str, list[float]] = field(default_factory=dict)  # the pods' milestones (`TRACE`)
    missing: dict[str, int] = field(default_factory=dict)
    window_s: float = 0.0
    create_s: float = 0.0
    operator_writes: Counter = field(default_factory=Counter)  # grpojob_api_writes_total by verb
    process_writes: Counter = field(default_factory=Counter)  # (client, verb, resource) of the operator process
    kuberay_writes: Counter = field(default_factory=Counter)  # rest_client_requests_total by method
    apiserver_writes: Counter = field(default_factory=Counter)  # (resource, verb)
    memory_kib: dict[str, int] = field(default_factory=dict)  # VmHWM / peak sampled VmRSS
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds of each process over the window
    idle_wait_s: float = 0.0  # from the window's end until every job settled (at most `--idle-settle-seconds`)
    idle_settled: int = 0  # how many jobs had settled when the idle time began
    idle_s: float = 0.0  # how long the jobs were left alone after that (`--idle-seconds`)
    idle_cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds of each process over that time
    idle_writes: float = 0.0  # the operator's API writes over that time
    passes: float = 0.0  # the operator's reconcile passes over the window (`grpojob_reconcile_duration_seconds`)
    load: tuple[float, float] = (0.0, 0.0)  # the machine's 1-minute load average at the start and the end


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        from grpojob_testing.cluster import Cluster, clusters_root

        self.args, self.work = args, work
        self.cluster = Cluster(clusters_root() / args.cluster_name)
        self.cluster_started = False
        self.operator: subprocess.Popen | None = None
        self.operator_metrics_port = 0
        self.api_client: Any = None

    # -- cluster, operators ------------------------------------------------------------------

    def up(self) -> None:
        self.cluster.load()
        if self.cluster.pids and any(self.cluster.running().values()):
            name = self.args.cluster_name
            raise RuntimeError(f"a cluster named {name!r} already runs; stop it first (cluster down --name)")
        self.cluster_started = True
        self.cluster.up(cpu_nodes=self.args.cpu_nodes, gpu_nodes=self.args.gpu_nodes)
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(str(self.cluster.kubeconfig), client_configuration=configuration)
        configuration.connection_pool_maxsize = 32
        self.api_client = client.ApiClient(configuration)
        self.install_crd()
        # kwok's nodes patch their status and post events for a while after start; let that pass so the
        # first batch's counts are its own.
        time.sleep(self.args.warmup_seconds)

    def install_crd(self) -> None:
        import yaml
        from kubernetes import client

        from grpojob_testing.cluster import wait_until

        extensions = client.ApiextensionsV1Api(self.api_client)
        for path in sorted(CRD_DIR.glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            extensions.create_custom_resource_definition(crd)

            def established(name: str = crd["metadata"]["name"]) -> bool:
                conditions = extensions.read_custom_resource_definition(name).status.conditions or []
                return any(c.type == "Established" and c.status == "True" for c in conditions)

            wait_until(established, f"CRD {crd['metadata']['name']}", 60)

    def start_operator(self, namespace: str) -> None:
        from grpojob_trainer.net.loopback import free_port, wait_until_healthy

        self.operator_metrics_port, probe = free_port(), free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(self.cluster.kubeconfig),
            "GRPOJOB_METRICS_PORT": str(self.operator_metrics_port),
            "GRPOJOB_PROBE_PORT": str(probe),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
        }
        with open(self.work / f"operator-{namespace}.log", "ab") as log:
            self.operator = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--serve-operator", namespace],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        def running() -> None:
            if self.operator.poll() is not None:
                raise RuntimeError(f"the operator exited ({self.operator.returncode}); see {self.work}")

        wait_until_healthy(f"http://127.0.0.1:{probe}/healthz", 60, check=running)
        time.sleep(2)  # its watches and indexes list what is there

    def stop_operator(self) -> None:
        if self.operator is not None and self.operator.poll() is None:
            os.killpg(self.operator.pid, signal.SIGTERM)
            try:
                self.operator.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.operator.pid, signal.SIGKILL)
                self.operator.wait(10)
        self.operator = None

    def restart_kuberay(self) -> None:
        """A fresh KubeRay process, so its VmHWM is this batch's (the cluster's own start-up path)."""
        from grpojob_testing import build

        self.cluster._stop("kuberay-operator", self.cluster.pids["kuberay-operator"])
        component = build.load_components()["kuberay"]
        self.cluster._install_kuberay(build.build(component), component)
        self.cluster.save()
        time.sleep(2)

    # -- scraping -----------------------------------------------------------------------------

    def apiserver_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.cluster.pki.ca_cert))
        context.check_hostname = False
        context.load_cert_chain(self.cluster.pki.admin_cert, self.cluster.pki.admin_key)
        return context

    def snapshot(self) -> dict[str, Counter]:
        shots = {
            "apiserver": scrape(f"{self.cluster.server}/metrics", self.apiserver_context()),
            "kuberay": scrape(f"http://127.0.0.1:{self.cluster.ports['kuberay-metrics']}/metrics"),
        }
        if self.operator is not None:
            shots["operator"] = self.operator_metrics()
        return shots

    def operator_metrics(self) -> Counter:
        """The grpojob operator's own samples (none in a RayJob batch, which runs no operator)."""
        if self.operator is None:
            return Counter()
        return scrape(f"http://127.0.0.1:{self.operator_metrics_port}/metrics")

    # -- one batch ----------------------------------------------------------------------------

    def run_batch(self, kind: str, count: int) -> Batch:
        from kubernetes import client

        namespace = f"bench-{kind.lower()}-{count}"
        core = client.CoreV1Api(self.api_client)
        custom = client.CustomObjectsApi(self.api_client)
        core.create_namespace({"metadata": {"name": namespace}})
        if kind == GRPOJOB:
            self.start_operator(namespace)
        else:
            self.restart_kuberay()
        names = [f"{kind.lower()}-{i:03d}" for i in range(count)]
        marks = Milestones()
        watches = Watches(self.api_client)
        self._watch(kind, namespace, watches, marks)
        time.sleep(1.5)  # the watches are established
        result = Batch(kind, count)
        pids = {"kuberay": self.cluster.pids["kuberay-operator"]}
        if self.operator is not None:
            pids["operator"] = self.operator.pid
        try:
            with RssSampler(pids) as sampler:
                before = self.snapshot()
                cpu_before = {name: proc_cpu_seconds(pid) for name, pid in pids.items()}
                load_before = os.getloadavg()[0]
                started = time.monotonic()

                def create(name: str) -> None:
                    if kind == GRPOJOB:
                        body, plural, group = grpojob_manifest(name), "grpojobs", "grpo.dev"
                        version = "v1alpha1"
                    else:
                        body, plural, group, version = rayjob_manifest(name, namespace), "rayjobs", "ray.io", "v1"
                    marks.created[name] = time.monotonic()
                    custom.create_namespaced_custom_object(group, version, namespace, plural, body)

                with ThreadPoolExecutor(max_workers=min(8, count)) as pool:
                    list(pool.map(create, names))
                result.create_s = time.monotonic() - started
                keys = [key for key, _ in MILESTONES[kind]]
                deadline = started + self.args.batch_timeout_base + self.args.batch_timeout_per_job * count
                last_report = 0.0
                while marks.done(names, keys) < count and time.monotonic() < deadline:
                    if self.operator is not None and self.operator.poll() is not None:
                        raise RuntimeError(f"the operator exited ({self.operator.returncode}); see {self.work}")
                    if time.monotonic() - last_report > 15:
                        last_report = time.monotonic()
                        per_key = {k: sum(1 for n in names if k in marks.reached.get(n, {})) for k in keys}
                        print(f"  {kind} x{count}: {per_key} after {last_report - started:.0f}s", flush=True)
                    time.sleep(0.2)
                finished = time.monotonic()
                time.sleep(self.args.settle_seconds)
                after = self.snapshot()
                result.cpu_s = {name: proc_cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
                result.load = (load_before, os.getloadavg()[0])
                result.window_s = time.monotonic() - started
                result.memory_kib = {f"{name} peak sampled VmRSS": peak for name, peak in sampler.peak.items()}
                if self.args.idle_seconds:
                    self._measure_idle(result, pids, kind, namespace, count)
            for name, pid in pids.items():
                result.memory_kib[f"{name} VmHWM"] = proc_memory(pid)["VmHWM"]
            result.latencies = {key: marks.latencies(key) for key in keys}
            result.trace = {key: marks.latencies(key) for key, _ in TRACE}
            result.missing = {key: count - len(result.latencies[key]) for key in keys}
            if any(result.missing.values()):
                print(f"  {kind} x{count}: timed out after {finished - started:.0f}s: missing {result.missing}")
            self._count_writes(result, before, after)
        finally:
            watches.stop()
            self._delete_jobs(kind, namespace)
            self._delete_namespace(core, namespace)
            self.stop_operator()
        return result

    def _measure_idle(self, result: Batch, pids: dict[str, int], kind: str, namespace: str, count: int) -> None:
        """The batch's jobs left alone for `--idle-seconds` once every one of them has settled (GRPOJob phase
        Running with its environments ready, RayJob deployment status Running; at most `--idle-settle-seconds`
        more): the controllers' CPU seconds and the operator's API writes over that time (a Running job with
        nothing due should write nothing). The idle minute began earlier in session 15's 1,000-job run (last
        trainer Job created: 91 writes, the last jobs' way to Running), in session 16's runs (every job Running:
        35-46 writes, environments turning ready after their trainer ran) and in session 18's (a 2-minute cap:
        307 writes, each an EnvironmentsReady transition)."""
        from kubernetes import client

        custom = client.CustomObjectsApi(self.api_client)
        group, version, plural = ("grpo.dev", "v1alpha1", "grpojobs")
        if kind == RAYJOB:
            group, version, plural = "ray.io", "v1", "rayjobs"

        def running() -> int:
            items = custom.list_namespaced_custom_object(group, version, namespace, plural)["items"]
            if kind == RAYJOB:
                return sum(1 for item in items if (item.get("status") or {}).get("jobDeploymentStatus") == "Running")
            return sum(
                1
                for item in items
                if (item.get("status") or {}).get("phase") == "Running" and condition_true(item, "EnvironmentsReady")
            )

        waited = time.monotonic()
        while (settled := running()) < count and time.monotonic() - waited < self.args.idle_settle_seconds:
            time.sleep(2)
        result.idle_wait_s, result.idle_settled = time.monotonic() - waited, settled
        writes_before = self.operator_metrics()
        cpu_before = {name: proc_cpu_seconds(pid) for name, pid in pids.items()}
        time.sleep(self.args.idle_seconds)
        writes_after = self.operator_metrics()
        result.idle_s = self.args.idle_seconds
        result.idle_cpu_s = {name: proc_cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
        result.idle_writes = sum(select(delta(writes_after, writes_before), "grpojob_api_writes_total").values())

    def _watch(self, kind: str, namespace: str, watches: Watches, marks: Milestones) -> None:
        from kubernetes import client

        core = client.CoreV1Api(self.api_client)
        batch_api = client.BatchV1Api(self.api_client)
        custom = client.CustomObjectsApi(self.api_client)

        def owner(obj: dict) -> str | None:
            labels = obj["metadata"].get("labels") or {}
            return labels.get(JOB_LABEL) if kind == GRPOJOB else labels.get(RAYJOB_LABEL)

        def on_cluster(obj: dict, at: float) -> None:
            job = owner(obj)
            if job is None:
                return
            marks.mark(job, "cluster", at)
            if condition_true(obj, "HeadPodReady"):
                marks.mark(job, "head", at)
            if kind == RAYJOB and (obj.get("status") or {}).get("state") == "ready":
                marks.mark(job, "gate", at)

        def on_job(obj: dict, at: float) -> None:
            job = owner(obj)
            name = obj["metadata"]["name"]
            if job is not None and name == (f"{job}-trainer" if kind == GRPOJOB else job):
                marks.mark(job, "job", at)

        placed: dict[str, set[str]] = defaultdict(set)

        def on_pod(obj: dict, at: float) -> None:
            meta, status = obj["metadata"], obj.get("status") or {}
            labels = meta.get("labels") or {}
            node_type, cluster = labels.get("ray.io/node-type"), labels.get("ray.io/cluster", "")
            if node_type is None:
                return  # not a Ray pod (environment, trainer)
            # A GRPOJob's RayCluster is named like the job; a RayJob's like the RayJob plus "-<suffix>".
            job = cluster if kind == GRPOJOB else cluster.rpartition("-")[0]
            if (obj.get("spec") or {}).get("nodeName"):
                placed[job].add(meta["name"])
                if len(placed[job]) >= RAY_PODS_PER_JOB:
                    marks.mark(job, "placed", at)
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
            if node_type == "head" and ready and status.get("podIP"):
                marks.mark(job, "headpod", at)

        def on_config_map(obj: dict, at: float) -> None:
            job = owner(obj)
            if job is not None and obj["metadata"]["name"] == f"{job}-endpoints":
                marks.mark(job, "gate", at)

        watches.start(custom.list_namespaced_custom_object, ("ray.io", "v1", namespace, "rayclusters"), on_cluster)
        watches.start(batch_api.list_namespaced_job, (namespace,), on_job)
        watches.start(core.list_namespaced_pod, (namespace,), on_pod)
        if kind == GRPOJOB:
            watches.start(core.list_namespaced_config_map, (namespace,), on_config_map)

    def _count_writes(self, result: Batch, before: dict[str, Counter], after: dict[str, Counter]) -> None:
        writes = delta(after["kuberay"], before["kuberay"])
        for labels, value in select(writes, "rest_client_requests_total", method=lambda m: m in WRITE_VERBS).items():
            result.kuberay_writes[dict(labels)["method"]] += value
        api_delta = delta(after["apiserver"], before["apiserver"])
        for labels, value in select(api_delta, "apiserver_request_total", verb=lambda v: v in WRITE_VERBS).items():
            values = dict(labels)
            resource = values["resource"] + (f"/{values['subresource']}" if values.get("subresource") else "")
            result.apiserver_writes[(resource, values["verb"])] += value
        if "operator" in after:
            # the operator was started for this batch: its counters started at zero
            ops = after["operator"]
            for labels, value in select(ops, "grpojob_api_writes_total").items():
                result.operator_writes[dict(labels)["verb"]] += value
            result.passes = sum(select(ops, "grpojob_reconcile_duration_seconds_count").values())
            for labels, value in select(ops, "bench_operator_writes_total").items():
                values = dict(labels)
                result.process_writes[(values["client"], values["verb"], values["resource"])] += value

    def _delete_jobs(self, kind: str, namespace: str) -> None:
        """Delete the batch's GRPOJobs or RayJobs and wait until they are gone, while the namespace is still
        active. (Before issue 15 the GRPOJobs carried Kopf's finalizer, and deleting the namespace first hung:
        Kopf, watching one namespace, drops it as soon as it has a deletionTimestamp.)"""
        from kubernetes import client

        from grpojob_testing.cluster import wait_until

        custom = client.CustomObjectsApi(self.api_client)
        group, version, plural = (
            ("grpo.dev", "v1alpha1", "grpojobs") if kind == GRPOJOB else ("ray.io", "v1", "rayjobs")
        )
        custom.delete_collection_namespaced_custom_object(group, version, namespace, plural)

        def gone() -> bool:
            return not custom.list_namespaced_custom_object(group, version, namespace, plural)["items"]

        wait_until(gone, f"the {plural} of {namespace} to be deleted", 600, 1.0)

    def _delete_namespace(self, core: Any, namespace: str) -> None:
        from kubernetes import client

        from grpojob_testing.cluster import wait_until

        try:
            core.delete_namespace(namespace)
        except client.ApiException as error:
            if error.status != 404:
                raise

        def gone() -> bool:
            try:
                core.read_namespace(namespace)
            except client.ApiException as error:
                if error.status == 404:
                    return True
                raise
            return False

        started = time.monotonic()
        wait_until(gone, f"namespace {namespace} to be deleted", 600, 1.0)
        print(f"  namespace {namespace} deleted in {time.monotonic() - started:.0f}s", flush=True)

    def down(self) -> None:
        self.stop_operator()
        if self.cluster_started:
            self.cluster.down(keep_logs=self.args.keep_logs)


# ------------------------------------------------------------------------------------------------
# report


def fmt_s(values: list[float], q: float) -> str:
    return f"{percentile(values, q):.2f}" if values else "—"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "—"
    return f"{a / b:.2f}"


def pct(values: list[float], q: float) -> float | None:
    return percentile(values, q) if values else None


def report(batches: list[Batch]) -> str:
    """The markdown tables."""
    by = {(b.kind, b.count): b for b in batches}
    counts = sorted({b.count for b in batches})
    lines = [
        "Latency, seconds from each object's client-side create to the milestone seen by a watch "
        "(p50 / p95 over the jobs of the batch):",
        "",
        "| N | milestone | GRPOJob p50 | GRPOJob p95 | RayJob p50 | RayJob p95 | ratio p50 | ratio p95 |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    rows = (
        ("cluster", "RayCluster created (by the grpojob operator · by KubeRay's RayJob controller)"),
        ("head", "Ray head ready (RayCluster HeadPodReady): shared KubeRay/kwok path"),
        ("gate", "GRPOJob: `J-endpoints` written · RayJob: RayCluster state ready"),
        ("job", "trainer Job created · submitter Job created"),
    )
    for n in counts:
        g, r = by.get((GRPOJOB, n)), by.get((RAYJOB, n))
        for key, label in rows:
            gl = g.latencies.get(key, []) if g else []
            rl = r.latencies.get(key, []) if r else []
            lines.append(
                f"| {n} | {label} | {fmt_s(gl, 50)} | {fmt_s(gl, 95)} | {fmt_s(rl, 50)} | {fmt_s(rl, 95)} "
                f"| {ratio(pct(gl, 50), pct(rl, 50))} | {ratio(pct(gl, 95), pct(rl, 95))} |"
            )
    lines += [
        "",
        "Where the pods are (same watch, same kinds; p50 / p95 seconds from the create):",
        "",
        "| N | pod milestone | GRPOJob p50 | GRPOJob p95 | RayJob p50 | RayJob p95 |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for n in counts:
        g, r = by.get((GRPOJOB, n)), by.get((RAYJOB, n))
        for key, label in TRACE:
            gt = g.trace.get(key, []) if g else []
            rt = r.trace.get(key, []) if r else []
            lines.append(f"| {n} | {label} | {fmt_s(gt, 50)} | {fmt_s(gt, 95)} | {fmt_s(rt, 50)} | {fmt_s(rt, 95)} |")
    lines += [
        "",
        "API write requests per job (window: first create → last milestone + settle):",
        "",
        "| N | grpojob own (`grpojob_api_writes_total`) | + Kopf's | grpojob operator process | "
        "KubeRay during GRPOJob batch (RayCluster controller) | KubeRay during RayJob batch | "
        "RayJob controller (difference) | ratio operator process / RayJob controller | "
        "ratio (grpojob + KubeRay) / KubeRay |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n in counts:
        g, r = by.get((GRPOJOB, n)), by.get((RAYJOB, n))
        if not g or not r:
            continue
        own = sum(g.operator_writes.values()) / n
        kopf = sum(v for (c, _, _), v in g.process_writes.items() if c == "kopf") / n
        process = sum(g.process_writes.values()) / n
        kuberay_g = sum(g.kuberay_writes.values()) / n
        kuberay_r = sum(r.kuberay_writes.values()) / n
        rayjob_only = kuberay_r - kuberay_g
        lines.append(
            f"| {n} | {own:.1f} | {kopf:.1f} | {process:.1f} | {kuberay_g:.1f} | {kuberay_r:.1f} | {rayjob_only:.1f} "
            f"| {ratio(process, rayjob_only)} | {ratio(process + kuberay_g, kuberay_r)} |"
        )
    lines += [
        "",
        "Peak memory, MiB (each operator process started fresh for its batch):",
        "",
        "| N | grpojob operator VmHWM | KubeRay VmHWM | ratio | grpojob peak sampled VmRSS | "
        "KubeRay peak sampled VmRSS (RayJob batch) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n in counts:
        g, r = by.get((GRPOJOB, n)), by.get((RAYJOB, n))
        if not g or not r:
            continue
        gh, rh = g.memory_kib.get("operator VmHWM"), r.memory_kib.get("kuberay VmHWM")
        lines.append(
            f"| {n} | {gh / 1024:.0f} | {rh / 1024:.0f} | {ratio(gh, rh)} "
            f"| {g.memory_kib.get('operator peak sampled VmRSS', 0) / 1024:.0f} "
            f"| {r.memory_kib.get('kuberay peak sampled VmRSS', 0) / 1024:.0f} |"
        )
    lines += [
        "",
        "CPU seconds per job (user + system, over the batch's window) and the machine's load average:",
        "",
        "| N | grpojob operator | its reconcile passes per job | KubeRay during GRPOJob batch | KubeRay during "
        "RayJob batch | ratio grpojob / KubeRay (RayJob batch) | load at start → end (GRPOJob · RayJob batch) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for n in counts:
        g, r = by.get((GRPOJOB, n)), by.get((RAYJOB, n))
        if not g or not r or not g.cpu_s or not r.cpu_s:
            continue
        op, kg, kr = g.cpu_s.get("operator", 0) / n, g.cpu_s.get("kuberay", 0) / n, r.cpu_s.get("kuberay", 0) / n
        lines.append(
            f"| {n} | {op:.3f} | {g.passes / n:.1f} | {kg:.3f} | {kr:.3f} | {ratio(op, kr)} "
            f"| {g.load[0]:.1f} → {g.load[1]:.1f} · {r.load[0]:.1f} → {r.load[1]:.1f} |"
        )
    lines += ["", "Write requests by resource and verb (per batch, totals, not per job):", ""]
    for b in batches:
        if b.kind == GRPOJOB:
            own = ", ".join(f"{c} {v} {res}: {n:g}" for (c, v, res), n in sorted(b.process_writes.items()))
            lines.append(f"- GRPOJob x{b.count}, operator process: {own}")
        lines.append(
            f"- {b.kind} x{b.count}, KubeRay `rest_client_requests_total`: "
            + ", ".join(f"{m} {n:g}" for m, n in sorted(b.kuberay_writes.items()))
        )
        system = sum(n for (res, _), n in b.apiserver_writes.items() if res not in BACKGROUND)
        top = sorted(b.apiserver_writes.items(), key=lambda kv: -kv[1])
        lines.append(
            f"- {b.kind} x{b.count}, kube-apiserver `apiserver_request_total` (all clients, window "
            f"{b.window_s:.0f}s): {system / b.count:.1f} per job without node heartbeats and leases; "
            + ", ".join(f"{v} {res} {n:g}" for (res, v), n in top)
        )
    idle = [b for b in batches if b.idle_s]
    if idle:
        lines += [
            "",
            "Left alone once every job has settled (GRPOJob phase Running and EnvironmentsReady, RayJob deployment "
            "status Running; nothing due): CPU seconds per job per minute, and the grpojob operator's API writes:",
            "",
            "| N | kind | waited to settle, s | settled | seconds | grpojob operator CPU s / job / min | "
            "KubeRay CPU s / job / min | grpojob operator writes |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for b in idle:
            per = {name: cpu / b.count / (b.idle_s / 60) for name, cpu in b.idle_cpu_s.items()}
            operator = f"{per['operator']:.4f}" if "operator" in per else "—"
            writes = f"{b.idle_writes:g}" if b.kind == GRPOJOB else "—"
            lines.append(
                f"| {b.count} | {b.kind} | {b.idle_wait_s:.0f} | {b.idle_settled} | {b.idle_s:.0f} | {operator} "
                f"| {per.get('kuberay', 0):.4f} | {writes} |"
            )
    missing = [f"{b.kind} x{b.count}: {b.missing}" for b in batches if any(b.missing.values())]
    if missing:
        lines += ["", "**Jobs that did not reach a milestone before the batch timed out:** " + "; ".join(missing)]
    return "\n".join(lines)


def machine_facts() -> str:
    mem_kib = next(
        int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")
    )
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    return (
        f"`nproc` {os.cpu_count()} ({cpu}), {mem_kib / 1024 / 1024:.1f} GiB memory, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, kopf {metadata.version('kopf')}, "
        f"kubernetes client {metadata.version('kubernetes')}"
    )


def versions() -> str:
    pinned = tomllib.loads((REPO / "testing" / "versions.toml").read_text())
    return ", ".join(f"{name} {entry['version']}" for name, entry in pinned.items())


def write_doc(path: Path, section: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start = text.find(SECTION)
    if start == -1:
        text = text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    else:
        end = text.find("\n## ", start + len(SECTION))
        tail = text[end + 1 :] if end != -1 else ""
        text = text[:start] + section.rstrip("\n") + "\n" + ("\n" + tail if tail else "")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# ------------------------------------------------------------------------------------------------


NOTES = """What the numbers are:

- **Latency**: per job, seconds from just before its create request (client clock) to the first event of a
  watch in the benchmark process that shows the milestone; the same watch code times both kinds. *RayCluster
  created*: by the grpojob operator, or by KubeRay's RayJob controller. *Ray head ready*: the RayCluster's
  `HeadPodReady` condition, set by KubeRay's RayCluster controller once kwok reports the head pod Ready (the
  same code path for both kinds). The *gate* is what each operator waits for before it starts the driver: the
  grpojob operator writes `J-endpoints` once HeadPodReady is true and it sees the head pod ready with an IP;
  KubeRay v1.5.0's RayJob controller waits for the RayCluster's `.status.state: ready` (all pods, workers
  included, running) and then, in K8sJobMode, creates the submitter Job (`rayjob_controller.go`,
  `JobDeploymentStatusInitializing`). *Job created*: `J-trainer` or the RayJob's submitter Job. The ratio is
  grpojob / KubeRay (below 1: grpojob faster).
- **Writes** (POST, PUT, PATCH, DELETE) per job, counted from the first create to `--settle-seconds` after
  the last milestone: *grpojob own* is the operator's `grpojob_api_writes_total` (children, status patches
  and, since issue 15, its Events); *Kopf's* are the requests of Kopf's own HTTP client (before issue 15 its
  finalizer patches and the Events it posted for the operator; now none), counted by the launcher in this
  script that wraps both HTTP clients of the operator process (its total equals the operator's counter plus
  Kopf's). KubeRay's are the `rest_client_requests_total` of its one
  process, which runs the RayCluster controller as well as the RayJob controller; the RayCluster
  controller's share is measured in the GRPOJob batch (where no RayJob exists) and subtracted to estimate
  the RayJob controller's writes. The last ratio compares all operator writes on each path: grpojob +
  KubeRay's RayCluster controller against KubeRay alone. The per-resource lists below the tables, from the
  kube-apiserver's `apiserver_request_total`, include every client (controller-manager, scheduler, kwok,
  the benchmark's own creates), so they show the whole system's work; the GRPOJob creates more children
  (config, progress and endpoints ConfigMaps, a Service, trainer RBAC, an environment Deployment and
  Service) than a RayJob (RayCluster and submitter Job), which is most of the difference.
- **CPU**: user + system seconds of the operator process and of KubeRay's (`/proc/<pid>/stat`) over the
  batch's window, per job; with the machine's 1-minute load average at the start and the end of the batch
  (the machine is shared: read the latencies with it).
- **Memory**: VmHWM from `/proc/<pid>/status` after the batch; the grpojob operator is started for each
  batch and KubeRay is restarted before each RayJob batch, so each high-water mark is that batch's. Also the
  peak of VmRSS sampled every 0.2 s. KubeRay's process includes its RayCluster and RayService controllers.
- Everything (etcd, kube-apiserver, controller-manager, scheduler, kwok, KubeRay, the operator and the
  benchmark's watches) shares the machine's cores, so absolute times are this machine's; the ratios are the
  result."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="counts 1 and 3 (a check that it works); no doc")
    parser.add_argument("--counts", type=lambda s: [int(x) for x in s.split(",")], help="e.g. 1,10,100")
    parser.add_argument("--cpu-nodes", type=int, help="kwok CPU nodes (16 cores, 64Gi; default fits the largest N)")
    parser.add_argument("--gpu-nodes", type=int, help="kwok GPU nodes (8 GPUs each; default fits the largest N)")
    parser.add_argument("--warmup-seconds", type=float, default=30.0, help="quiet time after the cluster starts")
    parser.add_argument("--settle-seconds", type=float, default=10.0, help="writes counted this long after")
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="jobs left alone after the window")
    parser.add_argument(
        "--idle-settle-seconds", type=float, default=300.0, help="at most this long for every job to settle first"
    )
    parser.add_argument("--batch-timeout-base", type=float, default=120.0)
    parser.add_argument(
        "--batch-timeout-per-job", type=float, default=1.5, help="1,000 jobs: 27 minutes a batch, both in an hour"
    )
    parser.add_argument("--doc", type=Path, help=f"write the section into this file (default {DOC} unless --quick)")
    parser.add_argument("--no-doc", action="store_true")
    parser.add_argument("--cluster-name", default=CLUSTER_NAME, help="of the fresh test cluster (two runs at once)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the cluster's logs after `down`")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--serve-operator", metavar="NAMESPACE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.counts = args.counts or ([1, 3] if args.quick else [1, 10, 100])
    largest = max(args.counts)
    # per job: head 2 CPU/8Gi + trainer 2 CPU/8Gi on CPU nodes; 1 + 2 GPUs on GPU nodes (with room for
    # fragmentation of 2-GPU pods).
    args.cpu_nodes = args.cpu_nodes or math.ceil(largest / 4) + 2
    args.gpu_nodes = args.gpu_nodes or math.ceil(3 * largest / 8) + math.ceil(largest / 10) + 1
    if args.doc is None and not args.quick:
        args.doc = DOC
    if args.no_doc:
        args.doc = None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_operator:
        serve_operator(args.serve_operator)
        return 0
    shown = argv or sys.argv[1:]
    command = ".venv/bin/python benchmarks/operator_scale.py " + " ".join(shlex.quote(a) for a in shown)

    def terminate(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    work = Path(tempfile.mkdtemp(prefix="operator-scale-"))
    print(f"operator logs in {work}; cluster {args.cluster_name}: {args.cpu_nodes} CPU + {args.gpu_nodes} GPU nodes")
    bench = Bench(args, work)
    batches: list[Batch] = []
    started = time.monotonic()
    try:
        bench.up()
        for count in args.counts:
            for kind in (GRPOJOB, RAYJOB):
                print(f"{kind} x{count} ...", flush=True)
                batch = bench.run_batch(kind, count)
                batches.append(batch)
                heads = batch.latencies.get("job", [])
                print(f"  done: Job created p50 {fmt_s(heads, 50)}s p95 {fmt_s(heads, 95)}s", flush=True)
    finally:
        bench.down()
    elapsed = time.monotonic() - started
    table = report(batches)
    print(table)
    if args.json:
        raw = [
            {k: ({str(kk): vv for kk, vv in v.items()} if isinstance(v, dict) else v) for k, v in vars(b).items()}
            for b in batches
        ]
        args.json.write_text(json.dumps(raw, indent=1))
    if args.doc:
        section = "\n".join(
            [
                SECTION,
                "",
                "Reproduce (takes about " + f"{elapsed / 60:.0f} minutes here):",
                "",
                "```",
                command.strip(),
                "```",
                "",
                f"- Cluster: one fresh `grpojob_testing.cluster` named `{args.cluster_name}`, "
                f"{args.cpu_nodes} kwok CPU nodes and {args.gpu_nodes} kwok GPU nodes (8 `nvidia.com/gpu` each); "
                f"versions: {versions()}.",
                f"- Machine: {machine_facts()}.",
                "",
                NOTES,
                "",
                table,
            ]
        )
        write_doc(args.doc, section)
        print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
