"""Run the operator: `python -m grpojob_operator [--namespace NS ...] [--cluster-domain ...]`."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import uuid

import kopf

from grpojob_operator import handlers, metrics
from grpojob_operator.kube import new_api_client
from grpojob_operator.leader import LeaseElection
from grpojob_operator.malloc import limit_malloc_arenas
from grpojob_operator.settings import OperatorSettings, load_settings


def main(argv: list[str] | None = None) -> None:
    limit_malloc_arenas()  # before any thread starts
    settings = load_settings(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.log_level.upper() != "DEBUG":
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # not a line per timer tick
    metrics.serve(settings.metrics_port)
    asyncio.run(serve(settings))


async def serve(settings: OperatorSettings) -> None:
    """Kopf's watches and indexes at once; reconcile passes once this replica leads (at once without
    leader election)."""
    registry = kopf.OperatorRegistry()
    handlers.register(registry, settings)
    leading = asyncio.Event()
    election = None
    if settings.leader_election_namespace:
        loop = asyncio.get_running_loop()
        identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        election = LeaseElection(
            new_api_client(),
            settings.leader_election_namespace,
            settings.leader_election_lease,
            identity,
            settings.lease_duration_seconds,
        )
        election.start(lambda: loop.call_soon_threadsafe(leading.set))
    else:
        leading.set()
    liveness = f"http://0.0.0.0:{settings.probe_port}/healthz" if settings.probe_port else None
    try:
        await kopf.operator(
            registry=registry,
            clusterwide=not settings.namespaces,
            namespaces=settings.namespaces,
            standalone=True,
            # Kopf's default identity is user@host from getpass, which fails for a numeric UID that
            # has no passwd entry: the chart runs the operator as 65532 on an image without one.
            identity=f"grpojob-operator@{socket.gethostname()}",
            liveness_endpoint=liveness,
            memo=handlers.new_memo(settings, leading),
        )
    finally:
        if election is not None:
            election.release()


if __name__ == "__main__":
    main()
