"""Run a function on N torch.distributed ranks (spawned processes) and collect what each rank returns.

``fn(rank, world, host, port, *args)`` must be importable (a module-level function) and return something
picklable; ranks join their group themselves (e.g. with `grpojob_trainer.policy.ranks.init_ranks`)."""

from __future__ import annotations

import io
import traceback
from collections.abc import Callable
from typing import Any

import torch

from grpojob_trainer.net.loopback import free_port

HOST = "127.0.0.1"


def _rank_main(fn: Callable[..., Any], rank: int, world: int, port: int, queue: Any, args: tuple) -> None:
    try:
        value = io.BytesIO()  # as bytes: tensors put on a queue as shared memory vanish with this process
        torch.save(fn(rank, world, HOST, port, *args), value)
        queue.put((rank, True, value.getvalue()))
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def run_on_ranks(fn: Callable[..., Any], world: int, *args: Any, timeout_s: float = 300.0) -> list[Any]:
    """``[fn(0, …), …, fn(world - 1, …)]``, each on a process of its own; raises if any rank failed."""
    import queue as queues

    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results: Any = context.Queue()
    port = free_port(HOST)
    processes = [
        context.Process(target=_rank_main, args=(fn, rank, world, port, results, args), daemon=True)
        for rank in range(world)
    ]
    for process in processes:
        process.start()
    out: dict[int, Any] = {}
    errors = []
    try:
        for _ in range(world):
            rank, ok, value = results.get(timeout=timeout_s)
            if ok:
                out[rank] = torch.load(io.BytesIO(value), weights_only=False)
            else:
                errors.append(f"rank {rank}:\n{value}")
                break  # the other ranks may wait forever on the failed one
    except queues.Empty:
        errors.append(f"no answer from ranks {sorted(set(range(world)) - set(out))} within {timeout_s:.0f}s")
    finally:
        for process in processes:
            process.join(timeout=30 if not errors else 1)
            if process.is_alive():
                process.kill()
    if errors:
        raise RuntimeError("\n".join(errors))
    return [out[rank] for rank in range(world)]
