"""Kopf wiring: watch caches of the children, and the one reconcile pass every GRPOJob gets.

Every child kind is watched into a Kopf index keyed by (namespace, job name), filtered by the
`grpo.dev/job` label, holding only the summaries of `grpojob_operator.observe`. A daemon per GRPOJob
calls `reconcile` as soon as the job is seen, again whenever a child or the job itself changes (the
index functions and an event handler wake it), and at least every `reconcile_interval_seconds`.
`reconcile` reads those indexes (no API read), asks the state machine for a plan, carries it out,
writes the status once if it changed, and posts the events.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

import kopf

from grpojob_api import v1alpha1 as api
from grpojob_operator import metrics, names, state
from grpojob_operator.kube import ApiError, Kube, new_api_client
from grpojob_operator.observe import Observed, summarize
from grpojob_operator.settings import OperatorSettings

log = logging.getLogger(__name__)

# kind, group, version, plural of every child kind the operator watches.
WATCHED_CHILDREN = (
    ("Pod", "", "v1", "pods"),
    ("ConfigMap", "", "v1", "configmaps"),
    ("Service", "", "v1", "services"),
    ("ServiceAccount", "", "v1", "serviceaccounts"),
    ("PersistentVolumeClaim", "", "v1", "persistentvolumeclaims"),
    ("Deployment", "apps", "v1", "deployments"),
    ("Job", "batch", "v1", "jobs"),
    ("Role", "rbac.authorization.k8s.io", "v1", "roles"),
    ("RoleBinding", "rbac.authorization.k8s.io", "v1", "rolebindings"),
    ("RayCluster", "ray.io", "v1", "rayclusters"),
)


def index_id(kind: str) -> str:
    return f"children_{kind.lower()}"


def observed_from_indexes(indexes: dict[str, Any], namespace: str, job: str, uid: str) -> Observed:
    """Gather one job's children from the Kopf indexes (each a mapping key → store of summaries).

    Only children labelled with this job's uid count: a same-named job's leftovers are not its own."""
    children = {}
    for kind, *_ in WATCHED_CHILDREN:
        store = indexes[index_id(kind)].get((namespace, job, uid), [])
        children[kind] = {summary.name: summary for summary in store}
    return Observed(children)


def status_document(status: api.GRPOJobStatus) -> dict[str, Any]:
    """The status as written to the API (None fields included, so a merge patch clears them)."""
    return status.model_dump(mode="json", by_alias=True)


def reconcile(
    body: dict[str, Any], observed: Observed, settings: OperatorSettings, kube: Kube, now: datetime
) -> state.Plan:
    """One pass: plan, act in order, write the status if it changed. The caller posts the plan's events
    (Kopf posts them from its event loop, and this runs in a worker thread)."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    plan = state.plan(body, observed, settings, now)
    where = f"{namespace}/{name}"
    try:
        _carry_out(plan, kube, namespace, name, where)
    except ApiError as error:
        if not 400 <= error.status < 500 or error.status in (408, 429):
            raise  # transient: the daemon retries with backoff
        # The API refused a child as built from this spec (a quota, an admission webhook, a bad path):
        # retrying cannot help, so the job fails with the API's answer.
        state.reject(plan, f"the API server refused a child of this job: {error}", now)
    document = status_document(plan.status)
    if document != status_document(state.current_status(body)) or not body.get("status"):
        kube.write_status(namespace, name, document)
    return plan


def _carry_out(plan: state.Plan, kube: Kube, namespace: str, name: str, where: str) -> None:
    for action in plan.actions:
        if isinstance(action, state.Create):
            if kube.create(action.manifest):
                log.info(
                    "%s/%s: created %s %s",
                    namespace,
                    name,
                    action.manifest["kind"],
                    action.manifest["metadata"]["name"],
                )
        elif isinstance(action, state.Replace):
            kube.replace_data(action.manifest, action.stale_keys)
            log.info(
                "%s/%s: updated %s %s", namespace, name, action.manifest["kind"], action.manifest["metadata"]["name"]
            )
        elif isinstance(action, state.Patch):
            kube.patch(action.kind, namespace, action.name, action.patch)
            log.info("%s: patched %s %s", where, action.kind, action.name)
        elif isinstance(action, state.Delete):
            kube.delete(action.kind, namespace, action.name, action.propagation)
            log.info("%s: deleted %s %s", where, action.kind, action.name)
        elif isinstance(action, state.DeleteJob):
            kube.delete(api.KIND, namespace, name)
            log.info("%s: deleted (ttlSecondsAfterFinished)", where)


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    """Register the indexes, the per-job reconcile daemon and what wakes it, login, settings, probe."""
    operator_settings = settings
    for kind, group, version, plural in WATCHED_CHILDREN:
        _register_index(registry, kind, group, version, plural)

    @kopf.daemon(api.GROUP, api.VERSION, api.PLURAL, id="reconcile", cancellation_timeout=30, registry=registry)
    async def reconcile_job(
        body: kopf.Body, namespace: str, name: str, memo: kopf.Memo, stopped: kopf.DaemonStopped, **kwargs: Any
    ) -> None:
        key = (namespace, name)
        wake = memo.wakeups.setdefault(key, asyncio.Event())
        loop = asyncio.get_running_loop()
        failures = 0
        try:
            while not stopped:
                wake.clear()
                started = time.monotonic()
                raw = dict(body)  # Kopf keeps a daemon's body current
                observed = observed_from_indexes(kwargs, namespace, name, raw["metadata"].get("uid", ""))
                try:
                    plan = await loop.run_in_executor(
                        None, reconcile, raw, observed, memo.settings, memo.kube, datetime.now(UTC)
                    )
                except Exception:  # an API error: log it, back off, and try again (never crash the operator)
                    failures += 1
                    log.exception("%s/%s: reconcile failed (%d in a row)", namespace, name, failures)
                    await _wait_any([stopped.wait()], min(60.0, 2.0**failures))  # changes do not cut it short
                    continue
                failures = 0
                for event in plan.events:
                    kopf.event(body, type=event.type, reason=event.reason, message=event.message)
                metrics.observe_pass(raw, plan.status, time.monotonic() - started)
                await _wait_any([wake.wait(), stopped.wait()], memo.settings.reconcile_interval_seconds)
        finally:
            memo.wakeups.pop(key, None)
            metrics.forget(namespace, name)

    @kopf.on.event(api.GROUP, api.VERSION, api.PLURAL, id="wake-on-change", registry=registry)
    async def wake_on_change(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
        wake_job(memo, namespace, name)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    def configure_kopf(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, namespaced=bool(operator_settings.namespaces))

    @kopf.on.probe(id="jobs", registry=registry)
    def jobs_probe(**_: Any) -> int:
        return metrics.known_jobs()


def wake_job(memo: kopf.Memo, namespace: str, job: str) -> None:
    """Start the job's next reconcile pass now instead of at its next interval."""
    event = memo.wakeups.get((namespace, job))
    if event is not None:
        event.set()


async def _wait_any(awaitables: list[Any], seconds: float) -> None:
    """Wait ``seconds``, or less if one of ``awaitables`` (a wake-up, the daemon's stop) finishes first."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


def _register_index(registry: kopf.OperatorRegistry, kind: str, group: str, version: str, plural: str) -> None:
    async def index(
        body: kopf.Body, namespace: str, labels: kopf.Labels, memo: kopf.Memo, **_: Any
    ) -> dict[tuple[str, str, str], Any]:
        job = labels[names.JOB_LABEL]
        # The index is updated when this returns, before the daemon's task runs again.
        wake_job(memo, namespace, job)
        return {(namespace, job, labels.get(names.JOB_UID_LABEL, "")): summarize(kind, dict(body))}

    kopf.index(
        group or "",
        version,
        plural,
        id=index_id(kind),
        labels={names.JOB_LABEL: kopf.PRESENT},
        registry=registry,
    )(index)


def configure(kopf_settings: kopf.OperatorSettings, *, namespaced: bool) -> None:
    """Kopf's own settings: standalone (no peering CRDs), our finalizer name, quiet event posting.

    With a fixed list of namespaces there is nothing to discover, so Kopf does not scan (which would
    need the right to list namespaces and stalls for a minute without it). Timers are polled every
    second when cancelled, so a job the reconcile daemon itself deletes (ttlSecondsAfterFinished)
    loses its finalizer at once instead of after Kopf's default 60 seconds.
    """
    kopf_settings.peering.standalone = True
    kopf_settings.scanning.disabled = namespaced
    kopf_settings.background.cancellation_polling = 1
    kopf_settings.persistence.finalizer = "grpo.dev/operator"
    kopf_settings.posting.level = logging.INFO
    kopf_settings.watching.server_timeout = 300
    kopf_settings.networking.request_timeout = 60


def new_memo(settings: OperatorSettings) -> kopf.Memo:
    """Runtime state shared by the handlers: settings, the API writer, and each job's wake-up event."""
    return kopf.Memo(settings=settings, kube=Kube(new_api_client(), settings.exit_after_writes), wakeups={})
