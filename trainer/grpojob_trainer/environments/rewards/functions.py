"""Loading the reward file and calling its functions, in a worker process: what goes wrong is reported as one
line naming the function, the row and the exception's last line.

A function is called as TRL calls a reward function: ``prompts``, ``completions``, ``completion_ids`` and each
of the row's other columns as keyword arguments, each a list with one entry per completion; it returns one
number per completion, or None where it does not apply. It may be ``async def``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import math
import numbers
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from grpojob_trainer.environments.rewards.builtins import builtin
from grpojob_trainer.environments.rewards.config import RewardsConfig
from grpojob_trainer.environments.rewards.sandbox import Limits

MODULE_NAME = "grpojob_reward_file"


class RewardFileError(Exception):
    """The reward file does not import, or lacks a function it should define."""


class FunctionFailed(Exception):
    """A reward function raised or returned something that is not one reward per completion."""


def last_line(error: BaseException) -> str:
    """The exception's last line, as a traceback ends (``KeyError: 'solution'``)."""
    return traceback.format_exception_only(type(error), error)[-1].strip()


def where_in(error: BaseException, file: str | None) -> str:
    """`` (gsm8k.py, line 12)``: the deepest frame of the traceback in ``file``, or "" when none is."""
    if file is None:
        return ""
    found = ""
    for frame in traceback.extract_tb(error.__traceback__):
        if frame.filename == file:
            found = f" ({Path(file).name}, line {frame.lineno})"
    return found


def import_file(path: str) -> Any:
    """The reward file as a module; raises `RewardFileError` with the import's error in one line."""
    if not Path(path).is_file():
        raise RewardFileError(f"reward file {path} does not exist")
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    if spec is None or spec.loader is None:
        raise RewardFileError(f"reward file {path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    sys.path.insert(0, str(Path(path).parent))  # its neighbours import, as `python FILE` would let them
    try:
        spec.loader.exec_module(module)
    except BaseException as error:  # SystemExit and all: the file's problem, reported
        problem = f"{last_line(error)}{where_in(error, path)}"
        raise RewardFileError(f"reward file {path} does not import: {problem}") from None
    return module


def load_functions(config: RewardsConfig) -> list[Callable[..., Any]]:
    """The configured functions, in order: the reward file's by name, the built-ins."""
    module = import_file(config.file) if config.file is not None else None
    limits = Limits(config.sandbox.cpu_seconds, config.sandbox.memory_mb)
    functions = []
    for function in config.functions:
        if function.builtin is not None:
            functions.append(builtin(function.builtin, limits))
            continue
        found = getattr(module, str(function.name), None)
        if not callable(found):
            defined = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
            raise RewardFileError(
                f"reward file {config.file} defines no function {function.name}"
                f" (it defines: {', '.join(defined) or 'none'})"
            )
        functions.append(found)
    return functions


def call_function(
    function: Callable[..., Any], label: str, arguments: Mapping[str, list[Any]], row: str, file: str | None
) -> list[float | None]:
    """``function(**arguments)``, awaited if it is a coroutine, checked: one finite number or None per
    completion. Raises `FunctionFailed` naming ``label`` and ``row``."""
    count = len(arguments["completions"])
    try:
        result = function(**arguments)
        if inspect.isawaitable(result):
            result = asyncio.run(_awaited(result))
    except Exception as error:  # the user's code: any exception is its failure
        problem = f"{last_line(error)}{where_in(error, file)}"
        raise FunctionFailed(f"reward function {label} raised on {row}: {problem}") from None
    return check_rewards(result, count, label, row)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def check_rewards(result: Any, count: int, label: str, row: str) -> list[float | None]:
    """``result`` as rewards, one per completion; raises `FunctionFailed` for anything else."""
    failed = f"reward function {label} returned"
    if isinstance(result, (str, bytes, Mapping)) or not hasattr(result, "__len__") or not hasattr(result, "__iter__"):
        raise FunctionFailed(f"{failed} {type(result).__name__} on {row}: it must return a list of {count} numbers")
    values = list(result)
    if len(values) != count:
        raise FunctionFailed(f"{failed} {len(values)} rewards for {count} completions on {row}")
    rewards: list[float | None] = []
    for index, value in enumerate(values):
        if value is None:
            rewards.append(None)
            continue
        if hasattr(value, "item") and callable(value.item):  # a NumPy or torch scalar
            value = value.item()
        if not isinstance(value, numbers.Real):
            raise FunctionFailed(
                f"{failed} {value!r:.60} ({type(value).__name__}) for completion {index} on {row}: "
                "a reward is a number, or None where the function does not apply"
            )
        if not math.isfinite(float(value)):
            raise FunctionFailed(f"{failed} {float(value)} for completion {index} on {row}: a reward must be finite")
        rewards.append(float(value))
    return rewards
