"""What `grpojob run` shows while it trains.

In a terminal: a progress bar with the step, the mean reward and the step's time, and log lines written above it
(never through it); the loop's per-step lines go to the run's log file only (`<out>/run.log`). Anywhere else (a
pod's log, a pipe, a file), or with `--verbose`: no bar, one log line a step. The run's log file gets every line.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from grpojob_trainer.observability.metrics import REWARD, STEP_SECONDS

STEP_LOGGER = "grpojob_trainer.training.loop"
"""The logger of the training loop's per-step lines, which the bar replaces on the screen."""

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def wants_bar(stream: TextIO, *, verbose: bool = False, no_progress: bool = False) -> bool:
    """Whether `grpojob run` draws a progress bar on ``stream``: only on a terminal, and not when asked for every
    log line (``verbose``) or for no bar (``no_progress``)."""
    if verbose or no_progress:
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


PER_STEP_LINE = re.compile(r"step \d+/\d+ ")
"""How the loop's per-step line starts (`metrics.step_line`): ``step 12/200 reward ...``."""


class _NotPerStep(logging.Filter):
    """Lets through every record but the loop's per-step lines (its warnings, evaluations and exports still show)."""

    def filter(self, record: logging.LogRecord) -> bool:
        per_step = record.name == STEP_LOGGER and record.levelno == logging.INFO
        return not (per_step and PER_STEP_LINE.match(record.getMessage()))


def bar_postfix(metrics: Mapping[str, Any]) -> str:
    """The bar's text after tqdm's counts and rate: ``reward 0.412 last step 12.3s`` (what the step did not measure
    left out)."""
    parts = []
    reward = metrics.get(REWARD)
    if isinstance(reward, int | float) and math.isfinite(reward):
        parts.append(f"reward {reward:.3f}")
    seconds = metrics.get(STEP_SECONDS)
    if isinstance(seconds, int | float):
        parts.append(f"last step {seconds:.1f}s")
    return " ".join(parts)


class StepDisplay:
    """The run's output while the loop runs: every log line into ``log_file``; on the screen, with ``bar``, a
    progress bar over ``total`` steps that the log lines are written above, without the per-step lines.

    Use as a context manager around the loop, and pass ``on_step`` as the loop's step callback.
    """

    def __init__(self, name: str, total: int, log_file: Path, *, bar: bool) -> None:
        self.name = name
        self.total = total
        self.log_file = log_file
        self.show_bar = bar
        self._bar: Any = None
        self._stack = ExitStack()

    def __enter__(self) -> StepDisplay:
        root = logging.getLogger()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        to_file = logging.FileHandler(self.log_file, encoding="utf-8")
        to_file.setFormatter(logging.Formatter(LOG_FORMAT))
        to_file.setLevel(logging.INFO)
        root.addHandler(to_file)
        self._stack.callback(to_file.close)
        self._stack.callback(root.removeHandler, to_file)
        if not self.show_bar:
            return self
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        # The screen's handlers are replaced by one that writes above the bar (tqdm.write); the per-step lines
        # stay off the screen, since the bar carries them.
        before = list(root.handlers)
        self._stack.enter_context(logging_redirect_tqdm(loggers=[root]))
        per_step = _NotPerStep()
        for handler in root.handlers:
            if handler not in before:
                handler.addFilter(per_step)
        self._bar = tqdm(total=self.total, desc=self.name, unit="step", dynamic_ncols=True)
        self._stack.callback(self._bar.close)
        return self

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        """The loop's callback after each step: moves the bar (the log file has the step's line already)."""
        if self._bar is None:
            return
        self._bar.set_postfix_str(bar_postfix(metrics), refresh=False)
        self._bar.update(step - self._bar.n)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._stack.close()
