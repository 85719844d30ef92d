"""The processes that run the reward functions: user code never runs in the server's own process.

Each worker imports the reward file once when it starts (the server waits for every worker to say it is ready,
so a file that does not import stops the server before it serves) and then runs one function on one rollout
at a time. A call past ``timeoutSeconds`` kills its worker, which a new one replaces; so does a worker that
dies (a crash in native code, ``os._exit``). Workers are spawned, not forked: the server's threads and event
loop stay out of them.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from grpojob_trainer.environments.rewards.config import RewardsConfig
from grpojob_trainer.environments.rewards.functions import (
    FunctionFailed,
    RewardFileError,
    call_function,
    load_functions,
)

START_TIMEOUT_S = 300.0
"""How long a worker may take to import the reward file."""
STOP_TIMEOUT_S = 5.0


def serve(connection: Connection, config_json: str) -> None:
    """A worker's life: import, say ready (or why not), then answer calls until the server goes away."""
    config = RewardsConfig.model_validate_json(config_json)
    try:
        functions = load_functions(config)
    except RewardFileError as error:
        connection.send(("error", str(error)))
        return
    connection.send(("ready", None))
    while True:
        try:
            index, arguments, row = connection.recv()
        except (EOFError, OSError):
            return
        label = config.functions[index].label
        try:
            connection.send(("ok", call_function(functions[index], label, arguments, row, config.file)))
        except FunctionFailed as error:
            connection.send(("failed", str(error)))


class Worker:
    """One worker process and the server's end of its pipe."""

    def __init__(self, config: RewardsConfig) -> None:
        self.config = config
        self.process: Any = None
        self.connection: Connection | None = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the process and wait until it has imported the file; raises `RewardFileError` when it cannot."""
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        self.process = context.Process(
            target=serve, args=(theirs, self.config.model_dump_json(by_alias=True)), name="reward-worker", daemon=True
        )
        self.process.start()
        theirs.close()
        self.connection = ours
        if not ours.poll(timeout_s):
            self.stop()
            raise RewardFileError(f"reward file {self.config.file} did not import within {timeout_s:.0f} s")
        try:
            status, message = ours.recv()
        except EOFError:
            code = self._exit_code()
            raise RewardFileError(f"the reward worker exited while importing {self.config.file} ({code})") from None
        if status != "ready":
            self.stop()
            raise RewardFileError(message)

    def call(self, index: int, arguments: dict[str, list[Any]], row: str) -> list[float | None]:
        """Run function ``index`` on one rollout's arguments; raises `FunctionFailed` when it fails, runs past
        the time limit or takes its worker down (the worker is then replaced on the next call)."""
        if not self.alive:
            self.start()
        assert self.connection is not None
        label = self.config.functions[index].label
        timeout = self.config.timeout_seconds
        self.connection.send((index, arguments, row))
        if not self.connection.poll(timeout):
            self.stop()
            raise FunctionFailed(f"reward function {label} ran past its time limit ({timeout:g} s) on {row}")
        try:
            status, value = self.connection.recv()
        except EOFError:
            code = self._exit_code()
            self.stop()
            raise FunctionFailed(f"reward function {label} took its worker process down on {row} ({code})") from None
        if status == "failed":
            raise FunctionFailed(value)
        return value

    def _exit_code(self) -> str:
        self.process.join(STOP_TIMEOUT_S)
        return f"exit code {self.process.exitcode}"

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.join(STOP_TIMEOUT_S)
        if self.connection is not None:
            self.connection.close()
        self.process, self.connection = None, None


class WorkerPool:
    """``config.workers`` workers; `call` runs a function on the next idle one."""

    def __init__(self, config: RewardsConfig) -> None:
        self.config = config
        self.workers = [Worker(config) for _ in range(config.workers)]
        self._threads = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="reward-call")
        self._idle: asyncio.Queue[Worker] | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start every worker, side by side; raises `RewardFileError` (the first one's) when the file does not
        import."""
        errors: list[RewardFileError] = []

        def start(worker: Worker) -> None:
            try:
                worker.start()
            except RewardFileError as error:
                errors.append(error)

        threads = [threading.Thread(target=start, args=(worker,)) for worker in self.workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            self.stop()
            raise errors[0]

    async def call(self, index: int, arguments: dict[str, list[Any]], row: str) -> list[float | None]:
        """Function ``index`` on one rollout (see `Worker.call`)."""
        if self._idle is None:
            self._idle = asyncio.Queue()
            for worker in self.workers:
                self._idle.put_nowait(worker)
        worker = await self._idle.get()
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._threads, worker.call, index, arguments, row)
        finally:
            self._idle.put_nowait(worker)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self._threads.shutdown(wait=False, cancel_futures=True)
