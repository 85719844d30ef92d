"""Run the operator: `python -m grpojob_operator [--namespace NS ...] [--cluster-domain ...]`."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys

import kopf

from grpojob_operator import handlers, metrics
from grpojob_operator.settings import load_settings


def main(argv: list[str] | None = None) -> None:
    settings = load_settings(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.log_level.upper() != "DEBUG":
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # not a line per timer tick
    registry = kopf.OperatorRegistry()
    handlers.register(registry, settings)
    metrics.serve(settings.metrics_port)
    liveness = f"http://0.0.0.0:{settings.probe_port}/healthz" if settings.probe_port else None
    asyncio.run(
        kopf.operator(
            registry=registry,
            clusterwide=not settings.namespaces,
            namespaces=settings.namespaces,
            standalone=True,
            # Kopf's default identity is user@host from getpass, which fails for a numeric UID that
            # has no passwd entry: the chart runs the operator as 65532 on an image without one.
            identity=f"grpojob-operator@{socket.gethostname()}",
            liveness_endpoint=liveness,
            memo=handlers.new_memo(settings),
        )
    )


if __name__ == "__main__":
    main()
