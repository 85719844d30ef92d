"""Read `<job>-endpoints` the way every pod of a job must: never an older attempt's; and wait until the
environment servers it names answer (`wait_for_environments`).

A pod gets the endpoints through ``envFrom``, fixed when its container starts. Should that copy be of an
older attempt than the pod's own (`GRPOJOB_POD_ATTEMPT`) — a stale rendezvous after a failed run, as when
an operator with an outdated view wrote it — the pod says so in one line and re-reads the mounted copy
(`ENDPOINTS_MOUNT`, which the kubelet keeps current) until the operator's write of its attempt arrives.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from grpojob_api import endpoints
from grpojob_api.endpoints import ContractError, Endpoints
from grpojob_trainer.errors import EnvironmentNotReady
from grpojob_trainer.net.loopback import wait_until_healthy

log = logging.getLogger(__name__)


class StaleEndpoints(ContractError):
    """The endpoints stayed older than the pod's attempt for as long as it waited."""


def read_mounted(directory: Path) -> dict[str, str]:
    """The ConfigMap as the kubelet projects it: one file per key (its ``..data`` links skipped)."""
    if not directory.is_dir():
        return {}
    return {p.name: p.read_text() for p in directory.iterdir() if not p.name.startswith(".") and p.is_file()}


def current_endpoints(
    environ: Mapping[str, str],
    mounted: Path = Path(endpoints.ENDPOINTS_MOUNT),
    *,
    timeout_s: float = 600.0,
    poll_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Endpoints:
    """The endpoints of this pod's attempt: those of ``environ`` when they are not older than the pod's
    `GRPOJOB_POD_ATTEMPT`, else the mounted copy once it has caught up. Raises `ContractError` naming a
    missing key, `StaleEndpoints` when no current copy came within ``timeout_s``."""
    own = endpoints.pod_attempt(environ)
    found = Endpoints.from_data(environ)
    refusal = endpoints.stale(found, own)
    if refusal is None:
        return found
    log.error("%s; re-reading %s", refusal, mounted)
    waited = 0.0
    while waited < timeout_s:
        sleep(poll_s)
        waited += poll_s
        data = read_mounted(mounted)
        if not data:
            continue
        found = Endpoints.from_data(data)
        refusal = endpoints.stale(found, own)
        if refusal is None:
            log.info("%s now holds attempt %d; using it", mounted, found.attempt)
            return found
    raise StaleEndpoints(f"{refusal}; {mounted} did not catch up within {timeout_s:.0f}s")


def wait_for_environments(urls: dict[str, str], timeout_s: float = 600.0, interval_s: float = 2.0) -> None:
    """Wait until every environment Service answers GET / (on Kubernetes, where the pods start on their own);
    `EnvironmentNotReady` names the first that did not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    for name, url in urls.items():
        try:
            wait_until_healthy(url.rstrip("/") + "/", max(0.0, deadline - time.monotonic()), interval_s=interval_s)
        except TimeoutError as error:
            raise EnvironmentNotReady(f"environment {name}: {error}") from None
