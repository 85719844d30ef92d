"""Leader election with a `coordination.k8s.io/v1` Lease, so that of several replicas exactly one reconciles.

Every replica runs Kopf's watches and indexes (a standby's caches are warm, and watching writes nothing);
only the holder of the Lease runs reconcile passes. The rules are client-go's:

* A standby reads the Lease every `retry` seconds and takes it over when its record (holder, renewTime,
  resourceVersion) has not changed for `duration` seconds of the standby's own clock (no clock skew
  between machines matters), with the resourceVersion as a precondition, so two standbys cannot both win.
* The leader renews every `duration / 3`. If it could not renew for `2 · duration / 3` (the API server
  unreachable, say) it exits at once, before any standby may take over: two replicas never reconcile at
  the same time. Its restart comes back as a standby.
* A leader that stops cleanly gives the Lease up (an empty holder), so a rollout hands over at once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

log = logging.getLogger(__name__)

LOST_LEADERSHIP_EXIT = 4


def _micro_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElection:
    """Holds or waits for the Lease ``namespace/name`` as ``identity``."""

    def __init__(self, api_client: client.ApiClient, namespace: str, name: str, identity: str, duration: float) -> None:
        self.api = client.CoordinationV1Api(api_client)
        self.namespace, self.name, self.identity, self.duration = namespace, name, identity, duration
        self.retry = max(0.2, min(2.0, duration / 5))
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._version = ""
        self._leading = False
        self._stop = threading.Event()

    # -- the two states ------------------------------------------------------------------------

    def run(self, on_started_leading: Callable[[], None], on_lost: Callable[[], None] | None = None) -> None:
        """Block until this replica leads, call ``on_started_leading``, then renew until stopped; if a renewal
        deadline passes, call ``on_lost`` (by default: exit the process at once)."""
        while not self._stop.is_set() and not self._try_acquire():
            self._stop.wait(self.retry)
        if self._stop.is_set():
            return
        log.info("leading: holding Lease %s/%s as %s", self.namespace, self.name, self.identity)
        self._leading = True
        on_started_leading()
        renewed = time.monotonic()
        while not self._stop.wait(self.duration / 3):
            if self._renew():
                renewed = time.monotonic()
            elif time.monotonic() - renewed > 2 * self.duration / 3:
                log.error("lost Lease %s/%s: not renewed in time; stopping", self.namespace, self.name)
                (on_lost or _exit)()
                return

    def start(self, on_started_leading: Callable[[], None]) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(on_started_leading,), name="leader-election", daemon=True)
        thread.start()
        return thread

    def release(self) -> None:
        """Stop, and give the Lease up if this replica holds it, so a standby takes over without waiting."""
        self._stop.set()
        if not self._leading:
            return
        try:
            self.api.patch_namespaced_lease(
                self.name,
                self.namespace,
                {"metadata": {"resourceVersion": self._version}, "spec": {"holderIdentity": None}},
            )
            log.info("released Lease %s/%s", self.namespace, self.name)
        except client.ApiException as error:
            log.warning("could not release Lease %s/%s: %s", self.namespace, self.name, error.reason)

    # -- requests ------------------------------------------------------------------------------

    def _spec(self, acquired: bool, transitions: int) -> dict[str, Any]:
        now = _micro_time(datetime.now(UTC))
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.duration)),
            "renewTime": now,
            "leaseTransitions": transitions,
        }
        if acquired:
            spec["acquireTime"] = now
        return spec

    def _try_acquire(self) -> bool:
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except client.ApiException as error:
            if error.status != 404:
                log.warning("reading Lease %s/%s: %s", self.namespace, self.name, error.reason)
                return False
            body = {"metadata": {"name": self.name, "namespace": self.namespace}, "spec": self._spec(True, 0)}
            try:
                created = self.api.create_namespaced_lease(self.namespace, body)
            except client.ApiException:
                return False  # another replica created it first
            self._version = created.metadata.resource_version
            return True
        spec = lease.spec
        record = (spec.holder_identity, spec.renew_time, lease.metadata.resource_version)
        if record != self._observed:
            self._observed, self._observed_at = record, time.monotonic()
        free = not spec.holder_identity or spec.holder_identity == self.identity
        if not free and time.monotonic() - self._observed_at < (spec.lease_duration_seconds or self.duration):
            return False
        body = {
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": lease.metadata.resource_version,
            },
            "spec": self._spec(
                True, (spec.lease_transitions or 0) + (0 if spec.holder_identity == self.identity else 1)
            ),
        }
        try:
            replaced = self.api.replace_namespaced_lease(self.name, self.namespace, body)
        except client.ApiException:
            return False  # changed meanwhile: its holder renewed, or another standby won
        self._version = replaced.metadata.resource_version
        return True

    def _renew(self) -> bool:
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec.holder_identity != self.identity:
                log.error("Lease %s/%s is held by %s", self.namespace, self.name, lease.spec.holder_identity)
                (_exit)()
            spec = self._spec(False, lease.spec.lease_transitions or 0)
            spec["acquireTime"] = _micro_time(lease.spec.acquire_time) if lease.spec.acquire_time else spec["renewTime"]
            body = {
                "metadata": {
                    "name": self.name,
                    "namespace": self.namespace,
                    "resourceVersion": lease.metadata.resource_version,
                },
                "spec": spec,
            }
            self._version = self.api.replace_namespaced_lease(self.name, self.namespace, body).metadata.resource_version
        except client.ApiException as error:
            log.warning("renewing Lease %s/%s: %s", self.namespace, self.name, error.reason)
            return False
        except Exception as error:  # the API server unreachable
            log.warning("renewing Lease %s/%s: %r", self.namespace, self.name, error)
            return False
        return True


def _exit() -> None:
    logging.shutdown()
    os._exit(LOST_LEADERSHIP_EXIT)
