"""Start the generation server: ``python -m grpojob_trainer.generation.server --model PATH ...``.

In-process use (a Ray actor, local mode, tests): ``GenerationServer(backend, config).start()`` serves
on a background thread and keeps the backend at hand for `update_weights`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable

import torch
import uvicorn

from grpojob_trainer.generation.app import ServerConfig, create_app
from grpojob_trainer.generation.backend import GenerationBackend, SamplingParams
from grpojob_trainer.penguin.http import ThreadedServer


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags (each also readable from the environment variable named in its help)."""
    env = os.environ.get
    parser = argparse.ArgumentParser(description="OpenAI-compatible generation server (transformers backend)")
    parser.add_argument("--model", default=env("GENERATION_MODEL"), help="local model directory (GENERATION_MODEL)")
    parser.add_argument("--served-model-name", default=env("SERVED_MODEL_NAME", "policy"))
    parser.add_argument("--host", default=env("HOST", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=int(env("PORT", "8000")))
    parser.add_argument("--temperature", type=float, default=float(env("GENERATION_TEMPERATURE", "1.0")))
    parser.add_argument("--top-p", type=float, default=float(env("GENERATION_TOP_P", "1.0")))
    parser.add_argument("--max-new-tokens", type=int, default=int(env("GENERATION_MAX_NEW_TOKENS", "1024")))
    parser.add_argument("--max-model-len", type=int, default=None, help="default: the model's max positions")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampler")
    parser.add_argument("--batch-window-ms", type=float, default=10.0, help="how long to gather a batch")
    parser.add_argument("--max-batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    if not args.model:
        parser.error("--model (or GENERATION_MODEL) is required")
    return args


def main(argv: list[str] | None = None) -> None:
    """Load the model and serve until interrupted."""
    from grpojob_trainer.generation.transformers_backend import TransformersBackend

    args = parse_args(argv)
    backend = TransformersBackend(args.model, max_model_len=args.max_model_len, device=args.device, seed=args.seed)
    config = ServerConfig(
        served_model_name=args.served_model_name,
        sampling=SamplingParams(args.temperature, args.top_p, args.max_new_tokens),
        batch_window_s=args.batch_window_ms / 1000,
        max_batch_size=args.max_batch_size,
    )
    uvicorn.run(create_app(backend, config), host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
