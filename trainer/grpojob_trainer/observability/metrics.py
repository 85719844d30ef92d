"""Training metrics: a JSONL + TensorBoard logger, a step-time breakdown, and progress for the operator.

`MetricsLogger` writes every step's scalars to ``metrics.jsonl`` (one JSON object per line, ``step``
first), to TensorBoard and to any further `MetricSink` (Prometheus, MLflow, W&B). Only ``int``,
``float``, ``bool`` and ``str`` values are logged; anything else (tensors, lists, dicts, None) is
skipped with a one-time warning per key rather than crashing the run. `step_line` is the trainer's log
line of a step. `StepTimer` collects seconds per phase of a step. `ProgressPublisher` is how the
trainer reports ``{step, meanReward}`` (and what a stop needs); `FileProgressPublisher` writes it atomically to a
JSON file.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from grpojob_api.progress import BEST_EVALUATION_KEY, LAST_EVALUATION_KEY, EvaluationReport, StopReport

log = logging.getLogger(__name__)

Scalar = int | float | bool | str

# The phases of a GRPO step, in order (`StepTimer` reports each as ``time/<phase>``).
GENERATION = "generation"
"""Rollouts through the environment servers."""
ROLLOUT_WAIT = "rollout_wait"
"""Time the loop waited for rollouts: all of `GENERATION` on-policy, what training did not hide with
``spec.grpo.maxOffPolicySteps`` >= 1."""
PREPARE = "prepare"
"""Micro-batches, advantages and, with a KL penalty, the reference policy's log-probabilities."""
TRAINING = "training"
"""Forward, backward and the optimizer step."""
WEIGHT_SYNC = "weight_sync"
"""Pushing the new weights to every generation engine."""
CHECKPOINT = "checkpoint"
"""What the step waited for its checkpoint (on the steps that write one): the write before it, if still in flight,
and copying the state out of the policy. The write itself runs beside the next steps (`CHECKPOINT_WRITE_SECONDS`)."""

# Keys of the metrics every step logs that the log line and the Prometheus endpoint read.
REWARD = "rollout/reward/mean"
FAILED_ROLLOUTS = "rollout/failed"
ROLLOUTS = "rollout/count"
PROMPTS_TOO_LONG = "rollout/prompt_too_long"
GROUPS = "rollout/groups"
VARIED_GROUPS = "rollout/groups_with_varied_reward"
EVALUATION_REWARD = "eval/reward/mean"
EVALUATION_PASS_PREFIX = "eval/pass@"
EVALUATION_ROWS = "eval/rows"
EVALUATION_FAILED = "eval/failed"
EVALUATION_SECONDS = "eval/seconds"
"""Rollouts of the step, the failed ones included."""
STEP_SECONDS = "time/step"
GENERATED_TOKENS_PER_S = "throughput/generated_tokens_per_s"
WEIGHT_SYNC_SECONDS = "weight_sync/seconds"
CHECKPOINT_WRITE_SECONDS = "time/checkpoint_write"
"""The seconds a checkpoint's write took, beside training; logged with the step during which it finished."""


def scalars(metrics: Mapping[str, Any]) -> dict[str, Scalar]:
    """The entries of ``metrics`` whose values are ``int``, ``float``, ``bool`` or ``str`` (others dropped).

    Subclasses count (``numpy.float64`` is a ``float``); a 0-d tensor or a list does not.
    """
    return {key: value for key, value in metrics.items() if isinstance(value, Scalar)}


class MetricSink(Protocol):
    """Somewhere else every step's scalars go (the Prometheus endpoint, MLflow, W&B)."""

    def log(self, step: int, metrics: Mapping[str, Scalar]) -> None:
        """Take one step's scalars (only ``int``, ``float``, ``bool`` and ``str`` values)."""

    def close(self, failed: bool = False) -> None:
        """Flush and end; called once, when training ends (``failed`` when it ended with an error)."""


class MetricsLogger:
    """Writes metrics to ``<log_dir>/metrics.jsonl``, TensorBoard event files in ``log_dir`` and ``sinks``.

    Numbers go to TensorBoard as scalars (bools as 0/1), strings as text. Use as a context manager or
    call `close`, which closes the sinks too.
    """

    JSONL_NAME = "metrics.jsonl"

    def __init__(
        self, log_dir: str | os.PathLike[str], *, tensorboard: bool = True, sinks: Sequence[MetricSink] = ()
    ) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.log_dir / self.JSONL_NAME
        self._jsonl = self.jsonl_path.open("a", encoding="utf-8")
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.log_dir))
        self.sinks = list(sinks)
        self._warned: set[str] = set()

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Scalar]:
        """Log one step's metrics; returns what was logged (the skipped entries left out)."""
        logged = scalars(metrics)
        for key in metrics.keys() - logged.keys():
            if key not in self._warned:
                self._warned.add(key)
                log.warning("metric %r has a %s value; not logged", key, type(metrics[key]).__name__)
        record = {"step": step, **{key: value for key, value in logged.items() if key != "step"}}
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        if self._writer is not None:
            for key, value in logged.items():
                if isinstance(value, str):
                    self._writer.add_text(key, value, global_step=step)
                else:
                    self._writer.add_scalar(key, float(value), global_step=step)
            self._writer.flush()
        for sink in self.sinks:
            sink.log(step, logged)
        return logged

    def close(self, failed: bool = False) -> None:
        self._jsonl.close()
        if self._writer is not None:
            self._writer.close()
        for sink in self.sinks:
            sink.close(failed)

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(failed=exc is not None)


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a metrics JSONL file, in order."""
    with Path(path).open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


class StepTimer:
    """Seconds spent per phase of one step; a phase entered twice accumulates.

    ``with timer.phase("generation"): ...``; then `metrics` gives ``time/<phase>`` for each phase and
    ``time/step`` for the total of the phases. ``clock`` returns seconds (tests pass a fake one).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = self.clock()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + self.clock() - start

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def metrics(self, prefix: str = "time/") -> dict[str, float]:
        out = {f"{prefix}{name}": seconds for name, seconds in self.seconds.items()}
        out[f"{prefix}step"] = self.total
        return out


def step_line(step: int, max_steps: int, metrics: Mapping[str, Any]) -> str:
    """The trainer's log line of one step: step, mean reward, step time (and its phases), failed rollouts.

    ``step 3/16 reward 0.412 time 12.3s (generation 8.1s, prepare 0.2s, training 3.0s, weight_sync 0.4s)
    failed rollouts 0/64 groups with varied rewards 5/8 generated 1.2e+03 tokens/s``, with ``(N prompts too long for
    spec.generation.maxModelLen)`` after the failures when rows were skipped for that; what a step did not
    measure is left out.
    """
    parts = [f"step {step}/{max_steps}"]
    reward = metrics.get(REWARD)
    parts.append(f"reward {reward:.4g}" if isinstance(reward, int | float) and math.isfinite(reward) else "reward -")
    if isinstance(metrics.get(STEP_SECONDS), int | float):
        phases = [
            f"{phase} {metrics[f'time/{phase}']:.1f}s"
            for phase in (GENERATION, ROLLOUT_WAIT, PREPARE, TRAINING, WEIGHT_SYNC, CHECKPOINT)
            if isinstance(metrics.get(f"time/{phase}"), int | float)
        ]
        parts.append(f"time {metrics[STEP_SECONDS]:.1f}s" + (f" ({', '.join(phases)})" if phases else ""))
    failed, total = metrics.get(FAILED_ROLLOUTS), metrics.get(ROLLOUTS)
    if isinstance(failed, int | float):
        parts.append(f"failed rollouts {int(failed)}" + (f"/{int(total)}" if isinstance(total, int | float) else ""))
        if too_long := metrics.get(PROMPTS_TOO_LONG):
            parts.append(f"({int(too_long)} prompts too long for spec.generation.maxModelLen)")
    varied, groups = metrics.get(VARIED_GROUPS), metrics.get(GROUPS)
    if isinstance(varied, int | float) and isinstance(groups, int | float):
        parts.append(f"groups with varied rewards {int(varied)}/{int(groups)}")
    throughput = metrics.get(GENERATED_TOKENS_PER_S)
    if isinstance(throughput, int | float):
        parts.append(f"generated {throughput:.3g} tokens/s")
    return " ".join(parts)


def tokens_per_second(tokens: int, seconds: float) -> float:
    """Throughput; 0 when no time was measured (never a division by zero)."""
    return tokens / seconds if seconds > 0 else 0.0


class ProgressPublisher(ABC):
    """Where the trainer reports how far it is, for the operator to show in the GRPOJob's status."""

    @abstractmethod
    def publish(self, step: int, mean_reward: float, stop: StopReport | None = None) -> None:
        """Report that ``step`` finished with this mean reward, and what a stop would need (None: not measured
        yet; an earlier report of it stands)."""

    @abstractmethod
    def publish_output_model(self, path: str, step: int) -> None:
        """Report that the model of ``step`` was exported to ``path`` (inside the output claim)."""

    @abstractmethod
    def publish_evaluation(self, last: EvaluationReport, best: EvaluationReport | None) -> None:
        """Report the newest evaluation and the best so far."""


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


class FileProgressPublisher(ProgressPublisher):
    """Writes ``{"step": …, "meanReward": …}`` to a JSON file, atomically (temporary file, then rename).

    A reader never sees a half-written file. A non-finite mean reward is written as null.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def publish(self, step: int, mean_reward: float, stop: StopReport | None = None) -> None:
        reward = float(mean_reward)
        kept = ("outputModel", "outputModelStep", LAST_EVALUATION_KEY, BEST_EVALUATION_KEY, "stop")
        output = {k: v for k, v in (self.read() or {}).items() if k in kept}
        if stop is not None:
            output["stop"] = {
                "seconds": stop.seconds,
                "checkpointWriteSeconds": stop.write_seconds,
                "trainingSeconds": stop.training_seconds,
                "checkpointBytes": stop.checkpoint_bytes,
            }
        self._write({"step": int(step), "meanReward": reward if math.isfinite(reward) else None, **output})

    def publish_evaluation(self, last: EvaluationReport, best: EvaluationReport | None) -> None:
        evaluations = {LAST_EVALUATION_KEY: {"step": last.step, "meanReward": _finite_or_none(last.mean_reward)}}
        if best is not None:
            evaluations[BEST_EVALUATION_KEY] = {"step": best.step, "meanReward": best.mean_reward}
        self._write({**(self.read() or {}), **evaluations})

    def publish_output_model(self, path: str, step: int) -> None:
        self._write({**(self.read() or {}), "outputModel": path, "outputModelStep": int(step)})

    def _write(self, payload: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(payload, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def read(self) -> dict[str, Any] | None:
        """The last published progress, or None before the first."""
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
