"""How the server hands requests to its backend.

`BatchingEngine` batches requests that arrive concurrently (an asyncio queue drained by one worker with
a short window) for backends that generate a batch at a time; `DirectEngine` passes each request
straight to a backend that batches continuously itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from grpojob_trainer.generation.backend import (
    ContinuousBatchingBackend,
    GenerationBackend,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)


@dataclass
class _Pending:
    request: GenerationRequest
    params: SamplingParams
    future: asyncio.Future[GenerationResult]


class BatchingEngine:
    """Runs `GenerationBackend.generate` on batches of the requests that arrived within ``window_s``.

    One batch runs at a time, in a worker thread, so the event loop keeps serving HTTP meanwhile.
    Requests that arrive while a batch runs form the next batch. A request samples with ``params`` (the
    server's on-policy sampling parameters) unless it brings its own (an evaluation's), with its own token
    budget; a batch's requests of different parameters go to the backend as one call per parameters.
    """

    def __init__(
        self, backend: GenerationBackend, params: SamplingParams, *, window_s: float = 0.01, max_batch_size: int = 64
    ) -> None:
        self.backend = backend
        self.params = params
        self.window_s = window_s
        self.max_batch_size = max_batch_size
        self._queue: asyncio.Queue[_Pending] | None = None
        self._worker: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the batching worker on the running event loop."""
        self._queue = asyncio.Queue()
        self._worker = asyncio.create_task(self._run(), name="generation-batcher")

    async def stop(self) -> None:
        """Stop the worker; requests still queued fail with `RuntimeError`."""
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        while self._queue is not None and not self._queue.empty():
            pending = self._queue.get_nowait()
            if not pending.future.done():
                pending.future.set_exception(RuntimeError("the generation server is shutting down"))

    async def generate(self, request: GenerationRequest, params: SamplingParams | None = None) -> GenerationResult:
        """Queue one request (sampled with ``params``, default the engine's) and wait for its result."""
        if self._queue is None:
            raise RuntimeError("BatchingEngine.start() was not called")
        future: asyncio.Future[GenerationResult] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(request, params or self.params, future))
        return await future

    async def _run(self) -> None:
        queue = self._queue
        if queue is None:
            raise RuntimeError("BatchingEngine.start() was not called")
        while True:
            batch = [await queue.get()]
            deadline = asyncio.get_running_loop().time() + self.window_s
            while len(batch) < self.max_batch_size:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(queue.get(), remaining))
                except TimeoutError:
                    break
            batch = [p for p in batch if not p.future.cancelled()]
            for params in dict.fromkeys(p.params for p in batch):
                await self._generate([p for p in batch if p.params == params], params)

    async def _generate(self, batch: list[_Pending], params: SamplingParams) -> None:
        try:
            results = await asyncio.to_thread(self.backend.generate, [p.request for p in batch], params)
        except Exception as error:  # a failed batch fails its requests, not the server
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(error)
            return
        for pending, result in zip(batch, results, strict=True):
            if not pending.future.done():
                pending.future.set_result(result)


class DirectEngine:
    """Hands every request straight to a `ContinuousBatchingBackend` with the server's ``params``."""

    def __init__(self, backend: ContinuousBatchingBackend, params: SamplingParams) -> None:
        self.backend = backend
        self.params = params

    async def start(self) -> None:
        """Nothing to start: the backend's engine schedules requests itself."""

    async def stop(self) -> None:
        """Nothing to stop here; the backend's owner shuts it down."""

    async def generate(self, request: GenerationRequest, params: SamplingParams | None = None) -> GenerationResult:
        """Generate for one request, sampled with ``params`` (default the engine's)."""
        return await self.backend.generate_one(request, params or self.params)
