"""The GRPO loop: rollouts through the environments, a policy step, weight sync, metrics, checkpoints.

    for each step:  rows → `/run` on the environment servers (they call the generation engines)
                    → TrainingSamples → policy.train_step → weights to every engine
                    → metrics (JSONL, TensorBoard), progress, checkpoint every `interval` steps

It works the same with a local Ray head (`grpojob run`) and on a RayCluster (`grpojob train` in the
trainer pod); `grpojob_trainer.cli` sets up either and hands the pieces to `run_loop`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpojob_api import v1alpha1 as api
from grpojob_trainer.data import PromptDataset
from grpojob_trainer.errors import AllRolloutsFailed
from grpojob_trainer.metrics import GENERATION, WEIGHT_SYNC, MetricsLogger, ProgressPublisher, StepTimer
from grpojob_trainer.penguin.protocol import Row
from grpojob_trainer.penguin.rollouts import PolicySampling, collect_rollouts
from grpojob_trainer.policy_group import PolicyGroup
from grpojob_trainer.weight_sync import weight_sync_for

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


def run_loop(
    job: api.GRPOJob,
    *,
    policy: PolicyGroup,
    engines: list[Any],
    env_urls: dict[str, str],
    dataset: PromptDataset,
    logger: MetricsLogger,
    progress: ProgressPublisher,
    checkpoint_dir: Path,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    before_step: Callable[[], None] | None = None,
) -> LoopResult:
    """Train until ``spec.grpo.maxSteps``, resuming from the newest checkpoint in ``checkpoint_dir``.
    ``before_step`` runs before each step (the cluster's health check: it raises to end the attempt)."""
    spec = job.spec
    grpo, generation = spec.grpo, spec.generation
    resumed = policy.resume(str(checkpoint_dir))
    start = 0
    if resumed is not None:
        start, position = resumed
        dataset.restore(position)
        log.info("resumed from the checkpoint of step %d in %s", start, checkpoint_dir)
    weight_sync = weight_sync_for(policy, engines)
    weight_sync.push()  # the engines start from the policy's (possibly restored) weights
    sampling = PolicySampling(generation.temperature, generation.top_p, generation.max_new_tokens)
    config = job.model_dump(mode="json", by_alias=True, exclude_none=True)
    result = LoopResult(first_step=start + 1, last_step=start)
    failed_in_a_row = 0
    for step in range(start + 1, grpo.max_steps + 1):
        if before_step is not None:
            before_step()
        timer = StepTimer()
        started = time.perf_counter()
        rows, groups = expand_groups(dataset.next_batch(grpo.prompts_per_step), grpo.generations_per_prompt)
        with timer.phase(GENERATION):
            batch = asyncio.run(
                collect_rollouts(
                    rows,
                    env_urls,
                    concurrency=grpo.rollout_concurrency,
                    timeout_s=grpo.rollout_timeout_seconds,
                    retries=grpo.rollout_retries,
                    deadline_s=grpo.rollout_deadline_seconds,
                    group_indices=groups,
                    sampling=sampling,
                )
            )
        metrics: dict[str, float] = dict(batch.metrics)
        result.failed_rollouts += len(batch.failures)
        for failure in batch.failures[:3]:
            log.warning("step %d: rollout of row %d failed: %s", step, failure.row_index, failure.error)
        samples = batch.samples
        if not samples:
            failed_in_a_row += 1
            logger.log(step, metrics)
            if failed_in_a_row >= grpo.max_failed_steps:
                last_error = batch.failures[-1].error if batch.failures else "no rollouts"
                raise AllRolloutsFailed(
                    f"every rollout failed in {failed_in_a_row} consecutive steps (last: step {step}: {last_error})"
                )
            continue
        failed_in_a_row = 0
        metrics |= policy.train_step(samples)
        with timer.phase(WEIGHT_SYNC):
            metrics |= weight_sync.push()
        metrics |= timer.metrics()
        step_seconds = time.perf_counter() - started
        generated = sum(s.generated_tokens for s in samples)
        metrics |= {
            "time/step": step_seconds,
            "throughput/generated_tokens_per_s": generated / max(timer.seconds.get(GENERATION, 0.0), 1e-9),
            "throughput/tokens_per_s": sum(len(s.token_ids) for s in samples) / step_seconds,
        }
        mean_reward = metrics.get("rollout/reward/mean", math.nan)
        logger.log(step, metrics)
        progress.publish(step, mean_reward)
        result.last_step = step
        interval = spec.checkpointing.interval
        if step % interval == 0 or step == grpo.max_steps:
            policy.save(str(checkpoint_dir), step, dataset.position.as_dict(), config, spec.checkpointing.keep)
        if on_step is not None:
            on_step(step, metrics)
    return result
