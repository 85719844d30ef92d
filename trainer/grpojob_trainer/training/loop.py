"""The GRPO loop: rollouts through the environments, a policy step, weight sync, metrics, checkpoints.

    for each step:  rows → `/run` on the environment servers (they call the generation engines)
                    → TrainingSamples → policy.train_step → weights to every engine
                    → metrics (JSONL, TensorBoard, the sinks), a log line, progress,
                      a checkpoint every `interval` steps

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

It works the same with a local Ray head (`grpojob run`) and on a RayCluster (`grpojob train` in the
trainer pod); `grpojob_trainer.cli` sets up either and hands the pieces to `run_loop`.
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

from grpojob_api import paths
from grpojob_api import v1alpha1 as api
from grpojob_api.progress import EvaluationReport
from grpojob_trainer.algorithm.samples import TrainingSample
from grpojob_trainer.errors import AllRolloutsFailed
from grpojob_trainer.experience.rollouts import EnvironmentURLs, PolicySampling, RolloutBatch, collect_rollouts
from grpojob_trainer.nemo_gym.protocol import Row
from grpojob_trainer.observability.metrics import (
    ROLLOUT_WAIT,
    WEIGHT_SYNC,
    MetricsLogger,
    ProgressPublisher,
    StepTimer,
    step_line,
)
from grpojob_trainer.policy.checkpoint import checkpoint_path
from grpojob_trainer.policy.group import PolicyGroup
from grpojob_trainer.training.data import Prompts, position_metrics
from grpojob_trainer.training.evaluation import (
    Evaluated,
    EvaluationHistory,
    Evaluator,
    evaluation_due,
    evaluation_line,
)
from grpojob_trainer.weight_sync.paths import weight_sync_for

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


def staleness_metrics(samples: list[TrainingSample], policy_version: int) -> dict[str, float]:
    """``rollout/staleness/{mean,max}``: how many updates behind ``policy_version`` (the policy about to
    train on them) the samples' generating policies are."""
    behind = [policy_version - sample.policy_version for sample in samples]
    return {"rollout/staleness/mean": sum(behind) / len(behind), "rollout/staleness/max": float(max(behind))}


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


async def run_loop(
    job: api.GRPOJob,
    *,
    policy: PolicyGroup,
    engines: list[Any],
    env_urls: EnvironmentURLs,
    dataset: Prompts,
    logger: MetricsLogger,
    progress: ProgressPublisher,
    checkpoint_dir: Path,
    output_dir: Path,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    before_step: Callable[[], None] | None = None,
    evaluation_rows: list[Row] | None = None,
    evaluation_token: str | None = None,
) -> LoopResult:
    """Train until ``spec.grpo.maxSteps``, resuming from the newest checkpoint in ``checkpoint_dir``, then
    export the model to ``output_dir`` (as the policy's ranks see it; `spec.output`): `<output>/final`, and
    `<output>/step_<step>` with each checkpoint when ``spec.output.everyCheckpoint``. Callers run it with
    ``asyncio.run``. ``before_step`` runs before each step (the cluster's health check: it raises to end
    the attempt). ``evaluation_rows``: the held-out rows of ``spec.evaluation``; ``evaluation_token``: the
    secret the engines accept as an evaluation's mark (`EVALUATION_MARK`)."""
    spec = job.spec
    grpo, generation = spec.grpo, spec.generation
    resumed = policy.resume(str(checkpoint_dir))
    start = 0
    position: dict[str, Any] = {}
    if resumed is not None:
        start, position = resumed
        dataset.restore(position)
        log.info("resumed from the checkpoint of step %d in %s", start, checkpoint_dir)
    weight_sync = weight_sync_for(policy, engines)
    weight_sync.push()  # the engines start from the policy's (possibly restored) weights
    sampling = PolicySampling(generation.temperature, generation.top_p, generation.max_new_tokens)
    generation_url = await engines[0].base_url.remote() if engines else None  # measures prompts too long
    evaluator = None
    if spec.evaluation is not None and evaluation_rows:
        evaluator = _evaluator(spec, evaluation_rows, evaluation_token, env_urls, generation_url)
        evaluator.history = EvaluationHistory.from_dict(position.get(EVALUATION_KEY))
    select_best = spec.output.select == api.OutputSelect.BEST_EVALUATION
    config = job.model_dump(mode="json", by_alias=True, exclude_none=True)
    began = time.perf_counter()

    def clock() -> float:
        """Seconds since the loop began (the ``timeline/*`` metrics)."""
        return time.perf_counter() - began

    result = LoopResult(first_step=start + 1, last_step=start)
    policy_version = start  # of the weights the policy holds and, between steps, the engines serve
    launched: deque[LaunchedRollouts] = deque()
    next_launch = start + 1

    def launch(step: int) -> LaunchedRollouts:
        rows, groups = expand_groups(dataset.next_batch(grpo.prompts_per_step), grpo.generations_per_prompt)

        async def collect() -> tuple[RolloutBatch, float]:
            batch = await collect_rollouts(
                rows,
                env_urls,
                concurrency=grpo.rollout_concurrency,
                timeout_s=grpo.rollout_timeout_seconds,
                retries=grpo.rollout_retries,
                deadline_s=grpo.rollout_deadline_seconds,
                group_indices=groups,
                sampling=sampling,
                generation_url=generation_url,
            )
            return batch, clock()

        return LaunchedRollouts(
            step, policy_version, dataset.position.as_dict(), clock(), asyncio.create_task(collect())
        )

    def launch_ahead(step: int) -> None:
        """Launch every batch that may be in flight while ``step`` is next to train."""
        nonlocal next_launch
        while next_launch <= min(step + grpo.max_off_policy_steps, grpo.max_steps):
            launched.append(launch(next_launch))
            next_launch += 1

    async def evaluate(step: int) -> dict[str, float]:
        """Evaluate the weights the engines serve (those of ``step``), the next step's rollouts running too."""
        assert evaluator is not None
        launch_ahead(step + 1)
        metrics = await evaluator.run(step)
        log.info("%s", evaluation_line(step, metrics, evaluator.spec.k))
        last, best = evaluator.history.last, evaluator.history.best
        if last is not None:
            progress.publish_evaluation(_report(last), _report(best) if best else None)
        return metrics

    if evaluator is not None and evaluator.spec.before_training and start == 0:
        logger.log(0, await evaluate(0))

    failed_in_a_row = 0
    for step in range(start + 1, grpo.max_steps + 1):
        if before_step is not None:
            before_step()
        timer = StepTimer()
        started = time.perf_counter()
        launch_ahead(step)
        rollouts = launched.popleft()
        with timer.phase(ROLLOUT_WAIT):
            batch, finished = await rollouts.task
        metrics: dict[str, float] = dict(batch.metrics)
        metrics |= position_metrics(rollouts.data_position)
        metrics |= {
            "timeline/rollouts_started": rollouts.started_s,
            "timeline/rollouts_finished": finished,
        }
        result.failed_rollouts += len(batch.failures)
        for failure in batch.failures[:3]:
            log.warning("step %d: rollout of row %d failed: %s", step, failure.row_index, failure.error)
        if not batch.samples:
            failed_in_a_row += 1
            metrics |= timer.metrics()
            logger.log(step, metrics)
            log.info("%s", step_line(step, grpo.max_steps, metrics))
            if failed_in_a_row >= grpo.max_failed_steps:
                last_error = batch.failures[-1].error if batch.failures else "no rollouts"
                raise AllRolloutsFailed(
                    f"every rollout failed in {failed_in_a_row} consecutive steps (last: step {step}: {last_error})"
                )
            continue
        failed_in_a_row = 0
        samples = [dataclasses.replace(s, policy_version=rollouts.policy_version) for s in batch.samples]
        metrics |= staleness_metrics(samples, policy_version)
        if not launched:  # no rollout in flight: engines sharing the policy's GPU may sleep while it trains
            metrics |= await asyncio.to_thread(weight_sync.release)
        metrics["timeline/training_started"] = clock()
        metrics |= await asyncio.to_thread(policy.train_step, samples)
        metrics["timeline/training_finished"] = clock()
        policy_version += 1
        with timer.phase(ROLLOUT_WAIT):  # the rollouts launched meanwhile must not see a weight change
            if pending := [later.task for later in launched if not later.task.done()]:
                await asyncio.wait(pending)
        metrics["timeline/weight_sync_started"] = clock()
        with timer.phase(WEIGHT_SYNC):
            metrics |= weight_sync.push()
        metrics["timeline/weight_sync_finished"] = clock()
        best_before = evaluator.history.best if evaluator is not None else None
        if evaluator is not None and evaluation_due(step, evaluator.spec.every_steps, grpo.max_steps):
            metrics |= await evaluate(step)
        new_best = evaluator is not None and evaluator.history.best != best_before
        metrics |= timer.metrics()
        step_seconds = time.perf_counter() - started
        generation_seconds = finished - rollouts.started_s
        generated = sum(s.generated_tokens for s in samples)
        metrics |= {
            "time/step": step_seconds,
            "time/generation": generation_seconds,
            "throughput/generated_tokens_per_s": generated / max(generation_seconds, 1e-9),
            "throughput/tokens_per_s": sum(len(s.token_ids) for s in samples) / step_seconds,
        }
        mean_reward = metrics.get("rollout/reward/mean", math.nan)
        logger.log(step, metrics)
        log.info("%s", step_line(step, grpo.max_steps, metrics))
        progress.publish(step, mean_reward)
        result.last_step = step
        interval = spec.checkpointing.interval
        if step % interval == 0 or step == grpo.max_steps or (select_best and new_best):
            saved_position = dict(rollouts.data_position)
            kept = None
            if evaluator is not None:
                saved_position[EVALUATION_KEY] = evaluator.history.as_dict()
                best = evaluator.history.best
                kept = best.step if select_best and best is not None else None
            policy.save(str(checkpoint_dir), step, saved_position, config, spec.checkpointing.keep, kept)
            if spec.output.every_checkpoint:  # off the event loop: later steps' rollouts are in flight
                await asyncio.to_thread(
                    export_model, job, policy, output_dir, paths.step_model_dir(step), step, progress
                )
        if on_step is not None:
            on_step(step, metrics)
    best = evaluator.history.best if evaluator is not None else None
    if select_best and best is not None and best.step != result.last_step:
        export_checkpoint_model(job, policy, checkpoint_dir, output_dir, best.step, progress)
    else:
        export_model(job, policy, output_dir, paths.FINAL_MODEL_DIR, result.last_step, progress)
    return result


EVALUATION_KEY = "evaluation"
"""Where a checkpoint's loop position keeps the evaluation history (beside the dataset's position: epoch and
index, or a mixture's batches and sources)."""


def _evaluator(
    spec: api.GRPOJobSpec,
    rows: list[Row],
    token: str | None,
    env_urls: EnvironmentURLs,
    generation_url: str | None,
) -> Evaluator:
    evaluation = spec.evaluation
    assert evaluation is not None
    max_new_tokens = spec.evaluation_max_new_tokens
    sampling = PolicySampling(evaluation.temperature, evaluation.top_p, max_new_tokens, evaluation_token=token)
    return Evaluator(rows, evaluation, sampling, env_urls, spec.grpo, generation_url)


def _report(evaluated: Evaluated) -> EvaluationReport:
    return EvaluationReport(evaluated.step, evaluated.mean_reward)


def export_checkpoint_model(
    job: api.GRPOJob,
    policy: PolicyGroup,
    checkpoint_dir: Path,
    output_dir: Path,
    step: int,
    progress: ProgressPublisher,
) -> None:
    """Export the model of the checkpoint of ``step`` (`spec.output.select: bestEvaluation`) as the final one."""
    output = job.spec.output
    checkpoint = checkpoint_path(checkpoint_dir, step)
    final = output_dir / paths.FINAL_MODEL_DIR
    written = policy.export_checkpoint(str(checkpoint), str(final), output.dtype, output.format)
    log.info("exported the model of step %d (the best evaluation) from %s to %s", step, checkpoint, written)
    progress.publish_output_model(f"{paths.output_dir(job)}/{paths.FINAL_MODEL_DIR}", step)


def export_model(
    job: api.GRPOJob, policy: PolicyGroup, output_dir: Path, name: str, step: int, progress: ProgressPublisher
) -> None:
    """Export the policy to ``output_dir / name`` and report it (by its path inside the output claim)."""
    output = job.spec.output
    written = policy.export(str(output_dir / name), output.dtype, job.spec.checkpointing.keep, output.format)
    log.info("exported the model of step %d to %s", step, written)
    progress.publish_output_model(f"{paths.output_dir(job)}/{name}", step)
