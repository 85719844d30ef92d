"""The generation server in a process that also holds its backend: ``GenerationServer(backend, config).start()``
serves on a background thread and keeps the backend at hand for `update_weights` (the `generation`
Ray actor, `grpojob run`, tests and benchmarks run it so)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from grpojob_trainer.generation.app import ServerConfig, create_app
from grpojob_trainer.generation.backend import GenerationBackend
from grpojob_trainer.net.http import ThreadedServer


class GenerationServer:
    """The OpenAI-compatible server for one backend, served from a background thread."""

    def __init__(
        self, backend: GenerationBackend, config: ServerConfig, *, host: str = "127.0.0.1", port: int | None = None
    ) -> None:
        self.backend = backend
        self.config = config
        self._server = ThreadedServer(create_app(backend, config), host=host, port=port)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (ends in ``/v1``), as in ``POLICY_BASE_URL``."""
        return f"{self._server.url}/v1"

    @property
    def url(self) -> str:
        """The server's root URL (``/tokenize`` and ``/health`` live here)."""
        return self._server.url

    def start(self) -> GenerationServer:
        """Start serving; returns self once the port accepts connections."""
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        self._server.stop()

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy new policy weights into the backend (waits for the running batch); returns the version."""
        return self.backend.update_weights(named_tensors)

    def __enter__(self) -> GenerationServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
