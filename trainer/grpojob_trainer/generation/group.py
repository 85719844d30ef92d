"""The driver's handle on the generation engines: their `GenerationWorker` actors and the URLs they serve at,
engine by engine, beside the policy's `grpojob_trainer.policy.group.PolicyGroup`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class GenerationGroup:
    """The engines, started and serving (see `start`)."""

    def __init__(self, engines: Sequence[Any], base_urls: Sequence[str]) -> None:
        if len(engines) != len(base_urls):
            raise ValueError(f"{len(engines)} engines but {len(base_urls)} URLs")
        self.engines = list(engines)
        """The `GenerationWorker` actors, which the weight paths send to."""
        self.base_urls = list(base_urls)
        """Each engine's OpenAI-compatible base URL."""

    @classmethod
    def start(cls, engines: Sequence[Any], timeout_s: float | None = None) -> GenerationGroup:
        """Wait until every engine (a `GenerationWorker` actor, created) serves; the group."""
        import ray

        return cls(engines, ray.get([engine.base_url.remote() for engine in engines], timeout=timeout_s))

    @property
    def measuring_url(self) -> str | None:
        """The URL whose `/tokenize` measures a prompt too long for the context (the first engine's), if any."""
        return self.base_urls[0] if self.base_urls else None
