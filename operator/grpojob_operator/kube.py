"""The operator's writes to the Kubernetes API: create, replace and delete children, write the status,
post Events. Every write of the operator goes through `Kube` and is counted in `grpojob_api_writes_total`
(Kopf itself writes nothing: no finalizer, no annotations, no Events).

Thin and generic over kinds: the paths come from the registry of kinds (`grpojob_operator.kinds`). A
create that finds the object already there (HTTP 409) and a delete that finds it gone (404) are
successes, which makes every pass idempotent.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime
from typing import Any

from kubernetes import client, config

from grpojob_api import v1alpha1 as api
from grpojob_operator import kinds, metrics

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 65.0
"""Longer than the API server's own limit on a request (``--request-timeout``, 60 s by default): a slow write
gets the server's answer, its success or its 504, instead of being given up on while the server carries
it out and then sent again (at 1,000 jobs a 30 s limit re-sent a third of a create per job, each a 409)."""


EVENT_SOURCE = "grpojob-operator"


def new_api_client(connections: int | None = None) -> client.ApiClient:
    """An API client from the in-cluster service account, or the kubeconfig outside a cluster, keeping up to
    ``connections`` connections open (the client's default without)."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    if connections:
        configuration.connection_pool_maxsize = connections
    return client.ApiClient(configuration)


class ApiError(Exception):
    """A Kubernetes API request that did not succeed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status

    def is_stale_cache(self) -> bool:
        """The object is not as the watch caches said: deleted (404) or created or replaced (409) meanwhile.
        The next pass, on fresher caches, decides again."""
        return self.status in (404, 409)

    def is_quota_exceeded(self) -> bool:
        """A ResourceQuota of the namespace has no room for the object (403 "exceeded quota"): room may come."""
        return self.status == 403 and "exceeded quota" in str(self)

    def is_transient(self) -> bool:
        """Worth retrying as it is: the server's own trouble, a timeout, or throttling."""
        return not 400 <= self.status < 500 or self.status in (408, 429)


class Kube:
    """Writes, each counted in ``writes`` (the scale benchmark reads it)."""

    def __init__(self, api_client: client.ApiClient, exit_after_writes: int | None = None) -> None:
        self.api = api_client
        self.writes = 0
        self.exit_after_writes = exit_after_writes

    def _call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json", kind: str = ""
    ) -> Any:
        self.writes += 1
        metrics.API_WRITES.labels(verb=method, kind=kind).inc()
        request = self.api.param_serialize(
            method,
            path,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*request, _request_timeout=REQUEST_TIMEOUT_S)
        payload = response.read()
        if self.exit_after_writes is not None and self.writes >= self.exit_after_writes:
            log.warning("exiting after %d writes (exit_after_writes)", self.writes)
            os._exit(3)
        if not 200 <= response.status < 300:
            raise ApiError(response.status, f"{method} {path}: {payload.decode(errors='replace')[:500]}")
        return json.loads(payload) if payload else None

    def create(self, manifest: dict[str, Any]) -> bool:
        """Create a child; False when it already exists."""
        meta = manifest["metadata"]
        try:
            self._call(
                "POST", kinds.of(manifest["kind"]).collection(meta["namespace"]), manifest, kind=manifest["kind"]
            )
        except ApiError as error:
            if error.status == 409:
                return False
            raise
        return True

    def replace_data(self, manifest: dict[str, Any], stale_keys: tuple[str, ...] = ()) -> None:
        """Make a ConfigMap's data what ``manifest`` says: a merge patch that sets every key and removes
        ``stale_keys`` (no read-modify-write race with fields we do not own)."""
        meta = manifest["metadata"]
        path = f"{kinds.of(manifest['kind']).collection(meta['namespace'])}/{meta['name']}"
        data: dict[str, Any] = {**dict.fromkeys(stale_keys), **manifest["data"]}
        self._call("PATCH", path, {"data": data}, "application/merge-patch+json", manifest["kind"])

    def patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any], subresource: str = "") -> None:
        """Merge-patch a child (or its ``subresource``): only the fields in ``patch`` change."""
        path = f"{kinds.of(kind).collection(namespace)}/{name}" + (f"/{subresource}" if subresource else "")
        self._call("PATCH", path, patch, "application/merge-patch+json", kind)

    def read_cluster_object(self, kind: str, name: str) -> dict[str, Any] | None:
        """A cluster-scoped object (a read: not counted as a write), None if absent."""
        request = self.api.param_serialize(
            "GET",
            f"{kinds.of(kind).collection()}/{name}",
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*request, _request_timeout=REQUEST_TIMEOUT_S)
        payload = response.read()
        if response.status == 404:
            return None
        if not 200 <= response.status < 300:
            raise ApiError(response.status, f"GET {kind} {name}: {payload.decode(errors='replace')[:500]}")
        return json.loads(payload)

    def delete(self, kind: str, namespace: str, name: str, propagation: str = "Background") -> bool:
        """Delete a child; False when it was already gone."""
        path = f"{kinds.of(kind).collection(namespace)}/{name}"
        try:
            self._call("DELETE", path, {"propagationPolicy": propagation}, kind=kind)
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    def write_status(self, namespace: str, name: str, status: dict[str, Any]) -> str:
        """The only status write of the operator (merge patch of the status subresource); returns the job's
        new resourceVersion."""
        path = f"{kinds.of(api.KIND).collection(namespace)}/{name}/status"
        written = self._call("PATCH", path, {"status": status}, "application/merge-patch+json", f"{api.KIND}/status")
        return str(((written or {}).get("metadata") or {}).get("resourceVersion", ""))

    def post_event(self, job: dict[str, Any], type_: str, reason: str, message: str, now: datetime) -> None:
        """A Kubernetes Event about the GRPOJob ``job`` (its metadata as read)."""
        meta = job["metadata"]
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": f"{api.GROUP}/{api.VERSION}",
                "kind": api.KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid", ""),
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": EVENT_SOURCE},
            "reportingComponent": EVENT_SOURCE,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self._call("POST", kinds.of("Event").collection(meta["namespace"]), event, kind="Event")
