"""Kopf wiring: watch caches of the children, and the one reconcile pass every GRPOJob gets.

Every child kind is watched into a Kopf index keyed by (namespace, job name), filtered by the
`grpo.dev/job` label, holding only the summaries of `grpojob_operator.observe`. A reconcile loop per
GRPOJob (an asyncio task of ours, not a Kopf daemon: see `register`) calls `reconcile` as soon as the job is
seen, again whenever a child or the job itself changes (the index functions and an event handler wake it),
and at least every `reconcile_interval_seconds`.
`reconcile` reads those indexes (no API read), asks the state machine for a plan, carries it out,
writes the status once if it changed, and posts the events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf

from grpojob_api import v1alpha1 as api
from grpojob_operator import config_cache, kinds, metrics, names
from grpojob_operator.expectations import Expectations
from grpojob_operator.kube import ApiError, Kube, new_api_client
from grpojob_operator.observe import KueueContext, Observed, summarize
from grpojob_operator.plan import BuildError, build_failed, current_status, plan
from grpojob_operator.plan.actions import Action, Create, Delete, DeleteJob, Patch, Plan, Replace
from grpojob_operator.plan.conditions import quota_available, quota_exceeded, reject
from grpojob_operator.plan.events import transition_events
from grpojob_operator.settings import OperatorSettings

log = logging.getLogger(__name__)


def index_id(kind: str) -> str:
    return f"children_{kind.lower()}"


def observed_from_indexes(indexes: dict[str, Any], namespace: str, job: str, uid: str) -> Observed:
    """Gather one job's children from the Kopf indexes (each a mapping key → store of summaries).

    Only children labelled with this job's uid count: a same-named job's leftovers are not its own."""
    children = {}
    for kind in (k.kind for k in kinds.WATCHED):
        store = indexes[index_id(kind)].get((namespace, job, uid), [])
        children[kind] = {summary.name: summary for summary in store}
    return Observed(children)


def status_document(status: api.GRPOJobStatus) -> dict[str, Any]:
    """The status as written to the API (None fields included, so a merge patch clears them)."""
    return status.model_dump(mode="json", by_alias=True)


def reconcile(
    body: dict[str, Any],
    cached: Observed,
    settings: OperatorSettings,
    kube: Kube,
    now: datetime,
    expectations: Expectations | None = None,
    pool: Executor | None = None,
    build_failures: int = 0,
) -> Plan | None:
    """One pass: plan, act in order, write the status if it changed (one patch with every change), post an
    Event if the phase changed. Independent writes go at once through ``pool`` (`write_groups`).

    Raises `BuildError` when the plan cannot build the job's children, unless ``build_failures`` (the passes
    before this one that raised it, in a row) reach `settings.build_tries` with this one: then the job fails
    with reason BuildFailed.

    None when a write found the caches stale (HTTP 404 or 409: a child deleted or replaced meanwhile):
    nothing more is written, and the next pass decides again on fresher caches.

    Raises `WaitingForQuota` after writing the status when a child would exceed a ResourceQuota: the job
    keeps its phase (condition QuotaExceeded) and its loop retries with backoff, as KubeRay requeues."""
    expectations = expectations if expectations is not None else Expectations()
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    job = expectations.job(body)
    cached = kueue_context(job, cached, kube)
    old_status = current_status(job)
    try:
        result = plan(job, expectations.observed(cached), settings, now, config_cache.config_map)
    except BuildError as error:
        if build_failures + 1 < settings.build_tries:
            raise  # the loop retries with backoff
        result = build_failed(job, error, build_failures + 1, now)
    where = f"{namespace}/{name}"
    over_quota: ApiError | None = None
    try:
        _carry_out(result, kube, cached, expectations, namespace, name, where, pool)
    except ApiError as error:
        if error.is_transient():
            raise  # the loop retries with backoff
        if error.is_stale_cache():
            log.info("%s: the caches were behind (%s); the next pass decides again", where, error)
            return None
        if error.is_quota_exceeded():  # a quota frees up (jobs end, it is raised): wait, keeping the phase
            over_quota = error
            quota_exceeded(result.status, f"a child of this job exceeds a ResourceQuota: {error}", now)
        else:
            # The API refused a child as built from this spec (an admission webhook, a bad path): retrying
            # cannot help, so the job fails with the API's answer.
            reject(result, f"the API server refused a child of this job: {error}", now)
        result.events = transition_events(old_status, result.status)
    else:
        quota_available(result.status, now)
    document = status_document(result.status)
    if document != status_document(old_status) or not job.get("status"):
        try:
            version = kube.write_status(namespace, name, document)
        except ApiError as error:
            if error.status != 404:
                raise
            return None  # the job is gone; its worker stops at the deletion event
        expectations.wrote_status(meta.get("resourceVersion"), document, version)
        log.info("%s: status %s", where, _status_change(old_status, result.status))
    for event in result.events:
        try:
            kube.post_event(body, event.type, event.reason, event.message, now)
        except ApiError as error:  # an Event is worth no retry of the pass
            log.warning("%s: event %s not posted: %s", where, event.reason, error)
    if over_quota is not None:
        raise WaitingForQuota(str(over_quota)) from over_quota
    return result


class WaitingForQuota(Exception):
    """A pass stopped at a child that would exceed a ResourceQuota; the job's loop backs off before the next."""


def kueue_context(job: dict[str, Any], cached: Observed, kube: Kube) -> Observed:
    """For a job Kueue admits, what the plan needs from Kueue's cluster-scoped objects: before its Workload
    exists, the value of its WorkloadPriorityClass; once admitted, the specs of its flavors (node labels,
    tolerations). Other jobs read nothing."""
    meta = job.get("metadata", {})
    labels = meta.get("labels") or {}
    if not labels.get(names.QUEUE_NAME_LABEL):
        return cached
    workload = cached.get("Workload", names.ChildNames(meta.get("name", "")).workload)
    wanted = labels.get(names.PRIORITY_CLASS_LABEL)
    priority, problem = None, ""
    if wanted and workload is None:
        found = kube.read_cluster_object("WorkloadPriorityClass", wanted)
        if found is None:
            problem = f"WorkloadPriorityClass {wanted} (label {names.PRIORITY_CLASS_LABEL}) does not exist"
        else:
            priority = int(found.get("value", 0))
    flavors: dict[str, dict[str, Any]] = {}
    if workload is not None and workload.admitted:
        for flavor in sorted({f for _, names_ in workload.assignments for f in names_}):
            flavors[flavor] = (kube.read_cluster_object("ResourceFlavor", flavor) or {}).get("spec") or {}
    return dataclasses.replace(cached, kueue=KueueContext(priority, flavors, problem))


def _status_change(old: api.GRPOJobStatus, new: api.GRPOJobStatus) -> str:
    """What a status write changes, for the log: the phase, and each condition that changed."""
    before = {c.type: (c.status, c.reason, c.message) for c in old.conditions}
    changed = [
        f"{c.type}={c.status} ({c.reason}: {c.message})"
        for c in new.conditions
        if before.get(c.type) != (c.status, c.reason, c.message)
    ]
    phase = new.phase.value if old.phase == new.phase else f"{old.phase.value} → {new.phase.value}"
    return f"phase {phase}" + (f"; {', '.join(changed)}" if changed else "")


def write_groups(actions: list[Action]) -> list[list[Action]]:
    """The plan's actions in the order given, grouped into writes that may be sent at once: creates go
    together up to and including a ConfigMap or PersistentVolumeClaim write (pods read ConfigMaps and mount
    claims, so whatever the plan puts after one waits for it: the endpoints before the environments and the
    trainer, a hub model's cache claim before its download Job); a delete or a patch goes alone."""
    groups: list[list[Action]] = []
    current: list[Action] = []
    for action in actions:
        if isinstance(action, Create | Replace):
            current.append(action)
            if action.manifest["kind"] in ("ConfigMap", "PersistentVolumeClaim"):
                groups.append(current)
                current = []
            continue
        if current:
            groups.append(current)
            current = []
        groups.append([action])
    if current:
        groups.append(current)
    return groups


def _carry_out(
    result: Plan,
    kube: Kube,
    cached: Observed,
    expectations: Expectations,
    namespace: str,
    name: str,
    where: str,
    pool: Executor | None = None,
) -> None:
    """The plan's actions in order, each group of independent writes at once when there is a ``pool``."""
    for group in write_groups(result.actions):
        if pool is None or len(group) == 1:
            for action in group:
                _act(action, kube, cached, expectations, namespace, name, where)
            continue
        futures = [pool.submit(_act, action, kube, cached, expectations, namespace, name, where) for action in group]
        errors = [error for error in (future.exception() for future in futures) if error is not None]
        if errors:
            raise errors[0]


def _act(
    action: Action, kube: Kube, cached: Observed, expectations: Expectations, namespace: str, name: str, where: str
) -> None:
    if isinstance(action, Create):
        kind, child = action.manifest["kind"], action.manifest["metadata"]["name"]
        if kube.create(action.manifest):
            log.info("%s: created %s %s", where, kind, child)
        expectations.wrote_child(kind, child, cached.get(kind, child), summarize(kind, action.manifest))
    elif isinstance(action, Replace):
        kind, child = action.manifest["kind"], action.manifest["metadata"]["name"]
        kube.replace_data(action.manifest, action.stale_keys)
        log.info("%s: updated %s %s", where, kind, child)
        expectations.wrote_child(kind, child, cached.get(kind, child), summarize(kind, action.manifest))
    elif isinstance(action, Patch):
        kube.patch(action.kind, namespace, action.name, action.patch, action.subresource)
        log.info("%s: patched %s %s", where, action.kind, action.name)
    elif isinstance(action, Delete):
        kube.delete(action.kind, namespace, action.name, action.propagation)
        log.info("%s: deleted %s %s", where, action.kind, action.name)
        expectations.deleted_child(action.kind, action.name, cached.get(action.kind, action.name))
    elif isinstance(action, DeleteJob):
        kube.delete(api.KIND, namespace, name)
        log.info("%s: deleted (ttlSecondsAfterFinished)", where)


@dataclass
class JobWorker:
    """One GRPOJob's reconcile loop: the job as last seen, what wakes the loop, its unseen writes."""

    uid: str
    body: dict[str, Any]
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    expectations: Expectations = field(default_factory=Expectations)
    task: asyncio.Task[None] | None = None


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    """Register the indexes, what starts and wakes each job's reconcile loop, login, settings, probe.

    Each job is reconciled by an asyncio task of ours, not a Kopf daemon: Kopf puts a finalizer on every
    object with a daemon (two writes per job, and a deletion that waits for the operator). Nothing here
    needs one: ownerReferences garbage-collect the children, and the loop stops at the deletion event."""
    operator_settings = settings
    for kind in kinds.WATCHED:
        _register_index(registry, kind)

    @kopf.on.event(api.GROUP, api.VERSION, api.PLURAL, id="track", registry=registry)
    async def track(
        type: str | None, body: kopf.Body, namespace: str, name: str, memo: kopf.Memo, **kwargs: Any
    ) -> None:
        memo.indexes = {index_id(k.kind): kwargs[index_id(k.kind)] for k in kinds.WATCHED}
        key = (namespace, name)
        worker = memo.workers.get(key)
        uid = body.get("metadata", {}).get("uid", "")
        if worker is not None and (type == "DELETED" or worker.uid != uid):
            stop_worker(memo, key)
            worker = None
        if type == "DELETED":
            return
        raw = dict(body)
        if worker is None:
            worker = memo.workers[key] = JobWorker(uid, raw)
            worker.task = asyncio.create_task(_run_worker(memo, namespace, name, worker))
        elif worker.expectations.echoes_status(raw):
            worker.body = raw  # our own status write coming back: a pass would plan from the same inputs
            return
        worker.body = raw
        worker.wake.set()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    def configure_kopf(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, namespaced=bool(operator_settings.namespaces))

    @kopf.on.cleanup(registry=registry)
    async def stop_workers(memo: kopf.Memo, **_: Any) -> None:
        for key in list(memo.workers):
            stop_worker(memo, key)

    @kopf.on.probe(id="jobs", registry=registry)
    def jobs_probe(**_: Any) -> int:
        return metrics.known_jobs()


async def _run_worker(memo: kopf.Memo, namespace: str, name: str, worker: JobWorker) -> None:
    loop = asyncio.get_running_loop()
    failures = 0
    build_failures = 0  # passes in a row whose plan raised (`BuildError`)
    settled: tuple[Any, Observed] | None = None  # the inputs of the last pass, when it changed nothing
    woken = True
    try:
        while True:
            await memo.leading.wait()  # a standby replica reconciles nothing
            worker.wake.clear()
            started = time.monotonic()
            raw = worker.body
            cached = observed_from_indexes(memo.indexes, namespace, name, worker.uid)
            inputs = (raw.get("metadata", {}).get("resourceVersion"), cached)
            if not woken and inputs == settled and not waits_on_the_clock(raw, cached, worker.expectations):
                woken = await _wait_for_wake(worker, memo.settings.reconcile_interval_seconds)
                continue  # nothing changed and nothing is due: the pass would change nothing either
            try:
                result = await loop.run_in_executor(
                    memo.executor,
                    reconcile,
                    raw,
                    cached,
                    memo.settings,
                    memo.kube,
                    datetime.now(UTC),
                    worker.expectations,
                    memo.write_pool,
                    build_failures,
                )
            except BuildError as error:
                failures += 1
                build_failures += 1
                tries = f"{build_failures} of {memo.settings.build_tries} tries"
                log.error(
                    "%s/%s: could not build the job's children (%s): %s",
                    namespace,
                    name,
                    tries,
                    error,
                    exc_info=error.error,
                )
                await asyncio.sleep(backoff_seconds(failures))
                continue
            except WaitingForQuota as waiting:
                build_failures = 0
                failures += 1
                log.info("%s/%s: waiting for quota (%d in a row): %s", namespace, name, failures, waiting)
                await asyncio.sleep(backoff_seconds(failures))
                continue
            except Exception:  # an API error: log it, back off, and try again (never crash the operator)
                build_failures = 0
                failures += 1
                log.exception("%s/%s: reconcile failed (%d in a row)", namespace, name, failures)
                await asyncio.sleep(backoff_seconds(failures))  # changes do not cut it short
                continue
            failures = build_failures = 0
            settled = None
            if result is not None:
                metrics.observe_pass(raw, result.status, time.monotonic() - started)
                if not result.actions and not result.events and result.status == current_status(raw):
                    settled = inputs
            woken = await _wait_for_wake(worker, memo.settings.reconcile_interval_seconds)
    finally:
        metrics.forget(namespace, name)


def backoff_seconds(failures: int) -> float:
    """How long a job's loop waits after its ``failures``-th failed pass in a row."""
    return min(60.0, 2.0**failures)


async def _wait_for_wake(worker: JobWorker, seconds: float) -> bool:
    """Wait for a change of the job or its children, at most ``seconds``; whether one came."""
    try:
        await asyncio.wait_for(worker.wake.wait(), seconds)
    except TimeoutError:
        return False
    return True


def waits_on_the_clock(body: dict[str, Any], cached: Observed, expectations: Expectations) -> bool:
    """Whether a pass over unchanged inputs may still decide something new as time passes: a deadline
    (spec.activeDeadlineSeconds, spec.progressDeadlineSeconds: a stalled trainer changes nothing that a
    watch sees), a pod stuck for its grace period, ttlSecondsAfterFinished, or an unseen
    write's expiry. Otherwise the periodic pass of a job where nothing changed is skipped: at 1,000 jobs it
    was most of the operator's CPU."""
    spec = body.get("spec") or {}
    if (body.get("status") or {}).get("phase") in (api.Phase.SUCCEEDED.value, api.Phase.FAILED.value):
        return spec.get("ttlSecondsAfterFinished") is not None
    return (
        spec.get("activeDeadlineSeconds") is not None
        or spec.get("progressDeadlineSeconds") is not None
        or any(pod.stuck for pod in cached.pods())
        or bool(expectations.children)
    )


def stop_worker(memo: kopf.Memo, key: tuple[str, str]) -> None:
    worker = memo.workers.pop(key, None)
    if worker is not None and worker.task is not None:
        worker.task.cancel()


def wake_job(memo: kopf.Memo, namespace: str, job: str) -> None:
    """Start the job's next reconcile pass now instead of at its next interval."""
    worker = memo.workers.get((namespace, job))
    if worker is not None:
        worker.wake.set()


def _echoes_own_write(memo: kopf.Memo, key: tuple[str, str, str], kind: kinds.Kind, summary: Any) -> bool:
    """Whether a child's new summary is what the job's own pass just wrote (the watch echoing a create): at a
    burst of 100 jobs, those echoes were a quarter of all passes, each queued behind other jobs' real work."""
    namespace, job, uid = key
    worker = memo.workers.get((namespace, job))
    return worker is not None and worker.uid == uid and worker.expectations.echoes_child(kind.kind, summary)


def _register_index(registry: kopf.OperatorRegistry, kind: kinds.Kind) -> None:
    async def index(
        body: kopf.Body, namespace: str, labels: kopf.Labels, memo: kopf.Memo, **kwargs: Any
    ) -> dict[tuple[str, str, str], Any]:
        job = labels[names.JOB_LABEL]
        key = (namespace, job, labels.get(names.JOB_UID_LABEL, ""))
        summary = summarize(kind.kind, dict(body))
        # The index is updated when this returns, before the daemon's task runs again. An event that leaves
        # the summary as it was (KubeRay's status writes, a worker starting) has nothing for the plan to read.
        if summary not in kwargs[index_id(kind.kind)].get(key, []) and not _echoes_own_write(memo, key, kind, summary):
            wake_job(memo, namespace, job)
        return {key: summary}

    kopf.index(
        kind.group,
        kind.version,
        kind.plural,
        id=index_id(kind.kind),
        labels={names.JOB_LABEL: kopf.PRESENT},
        registry=registry,
    )(index)


class NoDiffBase(kopf.DiffBaseStorage):
    """Keeps no diff base. Kopf keeps each object's last handled state to hand on.create and on.update
    handlers their diffs; the operator has no such handler (its indexes and `track` see every event), yet Kopf
    builds that state, a deep copy of the whole body, on every event of every watched kind: a quarter of
    the operator's CPU while 1,000 jobs start (py-spy)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return {}

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def configure(kopf_settings: kopf.OperatorSettings, *, namespaced: bool) -> None:
    """Kopf's own settings: standalone (no peering CRDs; a Lease elects the active replica, see
    `leader`), no Events of its own (the operator posts one per phase change itself).

    With a fixed list of namespaces there is nothing to discover, so Kopf does not scan (which would
    need the right to list namespaces and stalls for a minute without it). The finalizer name is the
    one earlier versions put on jobs (with a daemon per job): Kopf removes it from them, once.
    """
    kopf_settings.peering.standalone = True
    kopf_settings.scanning.disabled = namespaced
    kopf_settings.persistence.finalizer = "grpo.dev/operator"
    kopf_settings.persistence.diffbase_storage = NoDiffBase()
    kopf_settings.posting.enabled = False
    kopf_settings.watching.server_timeout = 300
    kopf_settings.networking.request_timeout = 60
    # Kopf's worker for an object keeps the object's last event (its whole body) until it has been idle this
    # long (5 s by default): at 100 jobs' start, 155 MiB at the peak against 133 MiB with 0.5 s.
    kopf_settings.queueing.idle_timeout = 0.5


def new_memo(settings: OperatorSettings, leading: asyncio.Event | None = None) -> kopf.Memo:
    """Runtime state shared by the handlers: settings, the API writer, each job's worker, the indexes, and
    whether this replica leads (set from the start without leader election)."""
    if leading is None:
        leading = asyncio.Event()
        leading.set()
    return kopf.Memo(
        settings=settings,
        kube=Kube(new_api_client(3 * settings.reconcile_workers), settings.exit_after_writes),
        executor=ThreadPoolExecutor(settings.reconcile_workers, thread_name_prefix="reconcile"),
        # Fault injection (exit_after_writes) wants one write at a time, so that each exit falls between two.
        write_pool=None
        if settings.exit_after_writes
        else ThreadPoolExecutor(2 * settings.reconcile_workers, thread_name_prefix="write"),
        workers={},
        indexes={},
        leading=leading,
    )
