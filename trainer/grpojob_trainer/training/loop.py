"""The GRPO loop: rollouts through the environments, a policy step, weight sync, metrics, checkpoints.

    for each step:  rows → `/run` on the environment servers (they call the generation engines)
                    → TrainingSamples → policy.train_step → weights to every engine
                    → a checkpoint every `interval` steps: the state copied out of the policy (timed: the log
                      line shows it), written in the background while the next steps train
                    → metrics (JSONL, TensorBoard, the sinks), a log line, progress (with what a stop needs)

Asynchronous GRPO (``spec.grpo.maxOffPolicySteps`` = k >= 1): the rollouts of steps s+1 … s+k are
launched before step s trains, so generation of the next steps overlaps training of this one. Weights
reach the engines only between steps with no rollouts in flight: after step s trains, the loop waits for
the rollouts launched meanwhile, pushes the new weights, and only then launches the next batch. Every
rollout of one batch thus comes from one policy version (recorded on each sample as
``TrainingSample.policy_version``), and a batch launched with the weights before step s-k trains at step
s: k updates stale, never more. With k = 0 the loop is the on-policy one: generate, train, push; and an
engine that shares the policy's GPU sleeps while the policy trains (`WeightSync.release`).

Evaluation (``spec.evaluation``, `grpojob_trainer.training.evaluation`): the starting policy before the
first step, then the policy of every ``everySteps``-th step and of the last, once its weights are on the
engines. The next step's rollouts are launched first, since they sample from the same weights; the loop
waits for the evaluation before that step trains, so the evaluated weights are still the ones served.
Its metrics are logged with its step's. With ``spec.output.select: bestEvaluation`` a step whose
evaluation is the best so far is checkpointed (and that checkpoint kept from pruning), and the final
export is that checkpoint's model.

A checkpoint stores the dataset position after the prompts of the step it saves, not after the prompts
already drawn for batches still waiting to train, so a resumed run draws those again: it trains the same
sequence of prompts as an uninterrupted run.

A checkpoint counts as written once on disk (`grpojob_trainer.training.checkpoints`): the run's end, a stop and
the export of the best evaluation's checkpoint wait for the write in flight.
A stop (SIGINT or SIGTERM, `grpojob_trainer.training.stop`) abandons a step still waiting for its rollouts and
finishes one that trains, without waiting for later rollouts, pushing its weights or evaluating them; the last
completed step is checkpointed unless it is, and `Interrupted` says where the run stopped. A lost Ray worker stops
it the same way (`grpojob_trainer.cluster.workers`), or the error of a call to it does; `WorkerLost` names it. An
error after a stop ends the run as the stop does (its exit code tells a preempted attempt from a failed one).

It works the same with a local Ray head (`grpojob run`) and on a RayCluster (`grpojob train` in the
trainer pod); `grpojob_trainer.commands` sets up either and hands the pieces to `run_loop`, which runs a
`TrainingLoop`: its methods are the step's parts, in the order a step takes them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray.exceptions import RayActorError

from grpojob_api import paths
from grpojob_api import v1alpha1 as api
from grpojob_trainer.algorithm.samples import TrainingSample
from grpojob_trainer.errors import AllRolloutsFailed
from grpojob_trainer.experience.metrics import staleness_metrics, throughput_metrics
from grpojob_trainer.experience.rollouts import EnvironmentURLs, PolicySampling, RolloutBatch, collect_rollouts
from grpojob_trainer.generation.group import GenerationGroup
from grpojob_trainer.nemo_gym.protocol import Row
from grpojob_trainer.observability.metrics import (
    CHECKPOINT,
    ROLLOUT_WAIT,
    WEIGHT_SYNC,
    MetricsLogger,
    ProgressPublisher,
    StepTimer,
    step_line,
)
from grpojob_trainer.policy.checkpoint import CheckpointRequest
from grpojob_trainer.policy.group import PolicyGroup
from grpojob_trainer.training.checkpoints import LoopCheckpoints
from grpojob_trainer.training.data import Prompts, position_metrics
from grpojob_trainer.training.evaluation import (
    EVALUATION_KEY,
    EvaluationHistory,
    Evaluator,
    evaluation_due,
    evaluation_line,
)
from grpojob_trainer.training.exports import export_checkpoint_model, export_model
from grpojob_trainer.training.stop import Interrupted, StopRequest, WorkerLost
from grpojob_trainer.weight_sync.paths import WeightSync, weight_sync_for

log = logging.getLogger(__name__)


@dataclass
class LoopResult:
    first_step: int
    last_step: int
    failed_rollouts: int = 0


def expand_groups(rows: list[Row], generations: int) -> tuple[list[Row], list[int]]:
    """Each row repeated ``generations`` times, with the group index (the row's place in the batch)."""
    expanded = [row for row in rows for _ in range(generations)]
    groups = [index for index in range(len(rows)) for _ in range(generations)]
    return expanded, groups


@dataclass
class LaunchedRollouts:
    """The rollouts of one step, launched (possibly ahead of the step's training)."""

    step: int
    policy_version: int
    """The weights the engines served at launch; no weights are pushed until the batch is done."""
    data_position: dict[str, Any]
    """The dataset position after this step's prompts: what a checkpoint of this step stores."""
    started_s: float
    task: asyncio.Task[tuple[RolloutBatch, float]]
    """The batch and when (on the loop's clock) it finished."""


@dataclass
class CompletedStep:
    """The last step the policy trained (0: none) and where its prompts ended."""

    step: int
    data_position: dict[str, Any]


async def run_loop(
    job: api.GRPOJob,
    *,
    policy: PolicyGroup,
    generation: GenerationGroup,
    environment_urls: EnvironmentURLs,
    dataset: Prompts,
    logger: MetricsLogger,
    progress: ProgressPublisher,
    checkpoint_dir: Path,
    output_dir: Path,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    before_step: Callable[[], None] | None = None,
    evaluation_rows: list[Row] | None = None,
    evaluation_token: str | None = None,
    stop: StopRequest | None = None,
) -> LoopResult:
    """Train until ``spec.grpo.maxSteps``, resuming from the newest checkpoint in ``checkpoint_dir``, then
    export the model to ``output_dir`` (as the policy's ranks see it; `spec.output`): `<output>/final`, and
    `<output>/step_<step>` with each checkpoint when ``spec.output.everyCheckpoint``. Callers run it with
    ``asyncio.run``. ``before_step`` runs before each step (the cluster's health check: it raises to end
    the attempt). ``evaluation_rows``: the held-out rows of ``spec.evaluation``; ``evaluation_token``: the
    secret the engines accept as an evaluation's mark (`EVALUATION_MARK`). ``stop``: the signal that ends the
    run early (`grpojob_trainer.training.stop`; callers run the loop under ``stop.watch``): the step in flight
    is abandoned or finished, the last completed step checkpointed, and `Interrupted` raised."""
    loop = TrainingLoop(
        job, policy, generation, environment_urls, dataset, logger, progress, checkpoint_dir, output_dir, stop
    )
    try:
        loop.resume()
        loop.start_weight_sync()
        loop.start_evaluation(evaluation_rows, evaluation_token)
        await loop.begin()
        for step in range(loop.start + 1, loop.grpo.max_steps + 1):
            if loop.stop.requested:
                break
            if before_step is not None:
                before_step()
            metrics = await loop.step(step)
            if metrics is not None and on_step is not None:
                on_step(step, metrics)
        await asyncio.to_thread(loop.checkpoints.collect, True)  # on disk before the run ends or names it
        await loop.end_if_stopped()
        loop.export_final()
    except (Interrupted, WorkerLost):
        raise
    except RayActorError as error:  # a call to a Ray worker that died: the run ends as on the watch's word
        await asyncio.to_thread(loop.stop.lost_in_call, error)
        await loop.end_after_error()
    except Exception:
        if not loop.stop.requested:
            await asyncio.to_thread(loop.checkpoints.finish_after_error)
            raise
        log.exception("after the stop")
        await loop.end_after_error()
    return loop.result


class TrainingLoop:
    """One run of the loop: the pieces it drives and where it stands (the step it resumed at, the weights'
    version, the rollouts launched ahead). `step` reads as a step runs: collect the rollouts, train, sync the
    weights, evaluate, checkpoint, log, export."""

    def __init__(
        self,
        job: api.GRPOJob,
        policy: PolicyGroup,
        generation: GenerationGroup,
        environment_urls: EnvironmentURLs,
        dataset: Prompts,
        logger: MetricsLogger,
        progress: ProgressPublisher,
        checkpoint_dir: Path,
        output_dir: Path,
        stop: StopRequest | None = None,
    ) -> None:
        self.job, self.spec, self.grpo = job, job.spec, job.spec.grpo
        self.policy, self.generation = policy, generation
        self.environment_urls, self.dataset = environment_urls, dataset
        self.logger, self.progress = logger, progress
        self.checkpoint_dir, self.output_dir = checkpoint_dir, output_dir
        self.stop = stop or StopRequest()
        asked = self.spec.generation
        self.sampling = PolicySampling(asked.temperature, asked.top_p, asked.max_new_tokens)
        self.config = job.model_dump(mode="json", by_alias=True, exclude_none=True)
        self.select_best = self.spec.output.select == api.OutputSelect.BEST_EVALUATION
        self.start = 0
        self.position: dict[str, Any] = {}
        self.weight_sync: WeightSync | None = None
        self.evaluator: Evaluator | None = None
        self.launched: deque[LaunchedRollouts] = deque()
        self.next_launch = 1
        self.policy_version = 0
        """The version of the weights the policy holds and, between steps, the engines serve."""
        self.failed_in_a_row = 0
        self.completed = CompletedStep(0, {})
        """Where a stop leaves the run: the last step trained."""
        self.checkpoints = LoopCheckpoints(policy, checkpoint_dir)
        self.result = LoopResult(first_step=1, last_step=0)
        self.began = time.perf_counter()

    def clock(self) -> float:
        """Seconds since the loop began (the ``timeline/*`` metrics)."""
        return time.perf_counter() - self.began

    def resume(self) -> None:
        """Load the newest checkpoint, if any: the policy's state, the data position, the step to go on from."""
        resumed = self.policy.resume(str(self.checkpoint_dir))
        if resumed is not None:
            self.start, self.position = resumed
            self.dataset.restore(self.position)
            log.info("resumed from the checkpoint of step %d in %s", self.start, self.checkpoint_dir)
            self.completed = CompletedStep(self.start, self.position)
            self.checkpoints.resumed(self.start)
        self.result = LoopResult(first_step=self.start + 1, last_step=self.start)
        self.policy_version, self.next_launch = self.start, self.start + 1

    def start_weight_sync(self) -> None:
        """Choose the weight path and push: the engines start from the policy's (possibly restored) weights."""
        self.weight_sync = weight_sync_for(self.policy, self.generation.engines)
        self.weight_sync.push()

    def start_evaluation(self, rows: list[Row] | None, token: str | None) -> None:
        """Set up `spec.evaluation` over ``rows``, with the history a resumed checkpoint kept."""
        if self.spec.evaluation is not None and rows:
            self.evaluator = Evaluator.for_job(
                self.spec, rows, token, self.environment_urls, self.generation.measuring_url
            )
            self.evaluator.history = EvaluationHistory.from_dict(self.position.get(EVALUATION_KEY))

    async def begin(self) -> None:
        """Start the clock of the ``timeline/*`` metrics, and evaluate the starting policy (the step-0 baseline)
        on a fresh run whose evaluation asks for it."""
        self.began = time.perf_counter()
        if self.evaluator is not None and self.evaluator.spec.before_training and self.start == 0:
            self.logger.log(0, await self.evaluate(0))

    # the step

    async def step(self, step: int) -> dict[str, float] | None:
        """One step; its metrics, or None for a step whose every rollout failed (it raises `AllRolloutsFailed`
        after ``spec.grpo.maxFailedSteps`` such steps in a row) or that a stop abandoned."""
        timer = StepTimer()
        started = time.perf_counter()
        collected = await self.collect_rollouts(step, timer)
        if collected is None:
            return None  # abandoned: the policy has not changed since the last completed step
        rollouts, batch, finished = collected
        metrics: dict[str, float] = dict(batch.metrics)
        metrics |= position_metrics(rollouts.data_position)
        metrics |= {"timeline/rollouts_started": rollouts.started_s, "timeline/rollouts_finished": finished}
        self.result.failed_rollouts += len(batch.failures)
        for failure in batch.failures[:3]:
            log.warning("step %d: rollout of row %d failed: %s", step, failure.row_index, failure.error)
        if not batch.samples:
            if not await asyncio.to_thread(self.stop.confirm_workers) and self.stop.requested:
                return None  # a lost engine failed them: the loop ends as the watch says
            self.count_failed_step(step, batch, metrics | timer.metrics())
            return None
        self.failed_in_a_row = 0
        samples = [dataclasses.replace(s, policy_version=rollouts.policy_version) for s in batch.samples]
        metrics |= staleness_metrics(samples, self.policy_version)
        metrics |= await self.train(samples)
        metrics |= await self.sync_weights(timer)
        best_before = self.evaluator.history.best if self.evaluator is not None else None
        if self.evaluation_due(step):
            metrics |= await self.evaluate(step)
        new_best = self.evaluator is not None and self.evaluator.history.best != best_before
        self.result.last_step = step
        self.completed = CompletedStep(step, rollouts.data_position)
        saving = self.checkpoint_due(step, new_best)
        if saving:  # before the step's log line, which shows what it waited for (the write before among it)
            with timer.phase(CHECKPOINT):
                metrics |= await self.save(step, rollouts.data_position)
        else:
            metrics |= self.checkpoints.collect()  # the write before, if it finished while this step trained
        metrics |= timer.metrics()
        metrics |= throughput_metrics(samples, time.perf_counter() - started, finished - rollouts.started_s)
        self.logger.log(step, metrics)
        log.info("%s", step_line(step, self.grpo.max_steps, metrics))
        self.progress.publish(step, metrics.get("rollout/reward/mean", math.nan), self.checkpoints.estimate.report())
        if saving:
            await self.export_step_model(step)
        return metrics

    def checkpoint_due(self, step: int, new_best: bool) -> bool:
        """Whether ``step`` writes a checkpoint: every ``interval`` steps, the last, a new best evaluation with
        ``select: bestEvaluation``, and the step a stop ends the run after."""
        return (
            step % self.spec.checkpointing.interval == 0
            or step == self.grpo.max_steps
            or (self.select_best and new_best)
            or self.stop.requested
        )

    def evaluation_due(self, step: int) -> bool:
        """Whether ``step``'s weights are evaluated: on its `spec.evaluation` schedule, unless the run stops."""
        if self.evaluator is None or self.stop.requested:
            return False
        return evaluation_due(step, self.evaluator.spec.every_steps, self.grpo.max_steps)

    def launch_rollouts(self, up_to: int) -> None:
        """Launch every batch that may be in flight while step ``up_to`` is next to train."""
        while self.next_launch <= min(up_to + self.grpo.max_off_policy_steps, self.grpo.max_steps):
            self.launched.append(self._launch(self.next_launch))
            self.next_launch += 1

    def _launch(self, step: int) -> LaunchedRollouts:
        grpo = self.grpo
        rows, groups = expand_groups(self.dataset.next_batch(grpo.prompts_per_step), grpo.generations_per_prompt)

        async def collect() -> tuple[RolloutBatch, float]:
            batch = await collect_rollouts(
                rows,
                self.environment_urls,
                concurrency=grpo.rollout_concurrency,
                timeout_s=grpo.rollout_timeout_seconds,
                retries=grpo.rollout_retries,
                deadline_s=grpo.rollout_deadline_seconds,
                group_indices=groups,
                sampling=self.sampling,
                generation_url=self.generation.measuring_url,
            )
            return batch, self.clock()

        position = self.dataset.position.as_dict()
        return LaunchedRollouts(step, self.policy_version, position, self.clock(), asyncio.create_task(collect()))

    async def collect_rollouts(
        self, step: int, timer: StepTimer
    ) -> tuple[LaunchedRollouts, RolloutBatch, float] | None:
        """Launch what may run ahead, then wait for ``step``'s batch; it, and when it finished (None: a stop came
        first)."""
        self.launch_rollouts(step)
        rollouts = self.launched.popleft()
        with timer.phase(ROLLOUT_WAIT):
            if not await self.stop.finished(rollouts.task):
                rollouts.task.cancel()
                return None
            batch, finished = rollouts.task.result()
        return rollouts, batch, finished

    def count_failed_step(self, step: int, batch: RolloutBatch, metrics: dict[str, float]) -> None:
        """Log a step without a single successful rollout; raise after ``maxFailedSteps`` of them in a row."""
        self.failed_in_a_row += 1
        self.logger.log(step, metrics)
        log.info("%s", step_line(step, self.grpo.max_steps, metrics))
        if self.failed_in_a_row >= self.grpo.max_failed_steps:
            last_error = batch.failures[-1].error if batch.failures else "no rollouts"
            raise AllRolloutsFailed(
                f"every rollout failed in {self.failed_in_a_row} consecutive steps (last: step {step}: {last_error})"
            )

    async def train(self, samples: list[TrainingSample]) -> dict[str, float]:
        """One policy step on ``samples``; engines sharing the policy's GPU sleep meanwhile when no rollout is
        in flight."""
        assert self.weight_sync is not None
        metrics: dict[str, float] = {}
        if not self.launched:
            metrics |= await asyncio.to_thread(self.weight_sync.release)
        metrics["timeline/training_started"] = self.clock()
        metrics |= await asyncio.to_thread(self.policy.train_step, samples)
        metrics["timeline/training_finished"] = self.clock()
        self.checkpoints.estimate.trained(metrics["timeline/training_finished"] - metrics["timeline/training_started"])
        self.policy_version += 1
        return metrics

    async def sync_weights(self, timer: StepTimer) -> dict[str, float]:
        """Push the new weights once the rollouts launched meanwhile are done (they must not see a change); on a
        stop, the step ends without them and pushes nothing (no engine serves again before the run resumes)."""
        assert self.weight_sync is not None
        with timer.phase(ROLLOUT_WAIT):
            if pending := [later.task for later in self.launched if not later.task.done()]:
                await self.stop.finished(asyncio.wait(pending))
        if self.stop.requested:
            return {}
        metrics = {"timeline/weight_sync_started": self.clock()}
        with timer.phase(WEIGHT_SYNC):
            metrics |= self.weight_sync.push()
        metrics["timeline/weight_sync_finished"] = self.clock()
        return metrics

    async def evaluate(self, step: int) -> dict[str, float]:
        """Evaluate the weights the engines serve (those of ``step``), the next step's rollouts running too."""
        assert self.evaluator is not None
        self.launch_rollouts(step + 1)
        metrics = await self.evaluator.run(step)
        log.info("%s", evaluation_line(step, metrics, self.evaluator.spec.k))
        last, best = self.evaluator.history.last, self.evaluator.history.best
        if last is not None:
            self.progress.publish_evaluation(last.report(), best.report() if best else None)
        return metrics

    async def export_step_model(self, step: int) -> None:
        """With ``spec.output.everyCheckpoint``, export the model of the checkpoint ``step`` just wrote (not on a
        stop)."""
        if self.spec.output.every_checkpoint and not self.stop.requested:  # off the event loop: rollouts run
            name = paths.step_model_dir(step)
            await asyncio.to_thread(export_model, self.job, self.policy, self.output_dir, name, step, self.progress)

    async def save(self, step: int, data_position: dict[str, Any]) -> dict[str, float]:
        """Start the checkpoint of ``step``, whose prompts end at ``data_position``, with the evaluation history
        (keeping the best evaluation's checkpoint), once the write before it finished (its metrics returned);
        returns once the policy may train on, the write running in the background."""
        saved_position = dict(data_position)
        kept = None
        if self.evaluator is not None:
            saved_position[EVALUATION_KEY] = self.evaluator.history.as_dict()
            best = self.evaluator.history.best
            kept = best.step if self.select_best and best is not None else None
        keep = self.spec.checkpointing.keep
        request = CheckpointRequest(str(self.checkpoint_dir), step, saved_position, self.config, keep, kept)
        return await asyncio.to_thread(self.checkpoints.start, request)

    async def end_if_stopped(self) -> None:
        """After a stop (the write in flight finished): drop the rollouts launched ahead, checkpoint the last
        completed step unless it has its checkpoint on disk (and the policy may still be read:
        `StopRequest.may_save`), and raise `Interrupted` (or `WorkerLost`) naming both, or the newest checkpoint
        there is."""
        if not self.stop.requested:
            return
        for later in self.launched:
            later.task.cancel()
        completed = self.completed
        if self.checkpoints.path(completed.step) is None and completed.step > 0 and self.stop.may_save:
            await self.save(completed.step, completed.data_position)
            await asyncio.to_thread(self.checkpoints.collect, True)
        log.info("stopped by %s after step %d", self.stop.name, completed.step)
        raise self.stop.ended(
            completed.step or None, self.checkpoints.path(completed.step) or self.checkpoints.newest()
        )

    async def end_after_error(self) -> None:
        """After an error once a stop was requested: the write in flight finishes if the policy's ranks are all
        alive (one in a collective with a lost rank never answers); then `end_if_stopped` raises."""
        if self.stop.may_save:
            await asyncio.to_thread(self.checkpoints.finish_after_error)
        await self.end_if_stopped()

    def export_final(self) -> None:
        """Export the final model: the last step's policy, or the best evaluation's checkpoint."""
        best = self.evaluator.history.best if self.evaluator is not None else None
        if self.select_best and best is not None and best.step != self.result.last_step:
            export_checkpoint_model(
                self.job, self.policy, self.checkpoint_dir, self.output_dir, best.step, self.progress
            )
        else:
            export_model(
                self.job, self.policy, self.output_dir, paths.FINAL_MODEL_DIR, self.result.last_step, self.progress
            )
