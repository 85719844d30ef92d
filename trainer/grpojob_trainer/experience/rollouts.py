"""Collect rollouts from NeMo Gym environment servers: the analogue of NeMo-RL's ``run_async_nemo_gym_rollout``.

`collect_rollouts` POSTs each row to ``<env url>/run`` with bounded concurrency, a per-request
timeout and retries with exponential backoff on transient failures (connection errors, timeouts,
408/429/5xx). A rollout that still fails is reported with its row index and error, never dropped;
results come back in input order. ``deadline_s`` bounds the whole batch: rollouts still running (or
still queued behind the concurrency limit) when it passes are abandoned and reported as failed, so an
environment that accepts and never answers holds a step for ``deadline_s``, not for every row's
timeouts and retries one after another. A row whose prompt does not fit the generation server's context
is skipped with a message that says so (`context_length`).

The client is aiohttp: with hundreds of rollouts in flight, httpx's connection pool spends time
quadratic in the number of open requests (it rescans every connection for every queued request),
which made the rollout path, not the engine, the slowest part of a GPU step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from pydantic import ValidationError

from grpojob_trainer.algorithm.samples import TrainingSample
from grpojob_trainer.experience.context_length import measure_prompt, overflowed_context, prompt_too_long
from grpojob_trainer.experience.conversion import RolloutConversionError, result_to_sample
from grpojob_trainer.experience.metrics import reward_part_metrics, rollout_metrics, timing_metrics
from grpojob_trainer.experience.replicas import EnvironmentURLs, Lookup, replica_urls, resolve_replicas, system_lookup
from grpojob_trainer.nemo_gym.errors import error_message, inner_client_error
from grpojob_trainer.nemo_gym.protocol import EVALUATION_MARK, Row, RunResult, describe

PROMPT_TOO_LONG = "rollout/prompt_too_long"
"""The step's rows skipped because their prompts do not fit the context."""
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504, 520})
MAX_BACKOFF_S = 30.0
ERROR_BODY_CHARS = 500


@dataclass(frozen=True)
class PolicySampling:
    """The sampling parameters written into every row (NeMo-RL overwrites them the same way): training's,
    or, with ``evaluation_token``, an evaluation's."""

    temperature: float
    top_p: float
    max_output_tokens: int | None = None
    """Caps the row's ``max_output_tokens`` (sets it when absent)."""
    evaluation_token: str | None = None
    """Marks the row's model calls as an evaluation's (`EVALUATION_MARK`); training rows never carry a
    mark, whatever their ``metadata`` says."""

    def apply(self, row: Row) -> Row:
        """A copy of ``row`` with these parameters in ``responses_create_params``."""
        request = row.responses_create_params
        update: dict[str, Any] = {"temperature": self.temperature, "top_p": self.top_p}
        if self.max_output_tokens is not None:
            asked = request.max_output_tokens
            update["max_output_tokens"] = min(asked, self.max_output_tokens) if asked else self.max_output_tokens
        metadata = {key: value for key, value in (request.metadata or {}).items() if key != EVALUATION_MARK}
        if self.evaluation_token is not None:
            metadata[EVALUATION_MARK] = self.evaluation_token
        if metadata or request.metadata is not None:
            update["metadata"] = metadata
        params = request.model_copy(update=update)
        return row.model_copy(update={"responses_create_params": params})


@dataclass(frozen=True)
class RolloutOutcome:
    """What became of one row: a sample, or an error (with the attempts it took)."""

    row_index: int
    env_name: str
    attempts: int
    sample: TrainingSample | None = None
    error: str | None = None
    started_s: float | None = None
    """Seconds after the batch began when the last attempt was sent (None: abandoned before one)."""
    finished_s: float | None = None
    """Seconds after the batch began when the outcome was decided (None: abandoned at the deadline)."""
    prompt_too_long: bool = False
    """The row was skipped because its prompt does not fit the generation server's context."""

    @property
    def ok(self) -> bool:
        return self.sample is not None


@dataclass(frozen=True)
class RolloutBatch:
    """Every row's outcome in input order, and the batch's metrics."""

    outcomes: list[RolloutOutcome]
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def samples(self) -> list[TrainingSample]:
        """The successful rollouts' samples, in input order."""
        return [o.sample for o in self.outcomes if o.sample is not None]

    @property
    def failures(self) -> list[RolloutOutcome]:
        """The rollouts that failed after their retries, in input order."""
        return [o for o in self.outcomes if o.sample is None]


class _Transient(Exception):
    """A failure worth retrying."""


class _Permanent(Exception):
    """A failure that retrying will not fix."""


def env_name_of(row: Row, environment_urls: Mapping[str, tuple[str, ...]]) -> str:
    """The environment a row goes to: ``agent_ref.name``, or the only environment when there is one (a
    NeMo Gym environment's URL is listed under its name and its agent's). ``environment_urls``: `replica_urls`'."""
    name = row.agent_ref.name if row.agent_ref is not None else None
    if name is None and len(set(environment_urls.values())) == 1:
        return next(iter(environment_urls))
    if name not in environment_urls:
        raise KeyError(f"row routed to environment {name!r}, but only {sorted(environment_urls)} have URLs")
    return name


async def collect_rollouts(
    rows: Sequence[Row | Mapping[str, Any]],
    environment_urls: EnvironmentURLs,
    *,
    concurrency: int = 32,
    timeout_s: float = 300.0,
    retries: int = 3,
    backoff_s: float = 1.0,
    group_indices: Sequence[int] | None = None,
    sampling: PolicySampling | None = None,
    deadline_s: float | None = None,
    generation_url: str | None = None,
    lookup: Lookup = system_lookup,
) -> RolloutBatch:
    """Run every row through its environment's ``/run`` and convert the results to training samples.

    An environment with several replica URLs gets row i at replica ``i % replicas``; a retry goes to the next.
    A URL whose host is a name counts as one replica per address ``lookup`` resolves it to, looked up once per
    call (`resolve_replicas`): on Kubernetes, each ready pod behind an environment's headless Service.

    ``group_indices[i]`` becomes sample i's ``group_index`` (default: i). ``sampling`` overwrites each
    row's temperature/top-p (and caps max_output_tokens). Rollouts not done ``deadline_s`` after the call
    are abandoned and reported as failed (with no attempts counted). ``generation_url``: the generation
    server that measures a prompt too long for its context, for the message. Raises, before any request,
    `KeyError` when a row names an unknown environment and pydantic's `ValidationError` when a row is
    not a NeMo Gym row.
    """
    if concurrency < 1 or retries < 0 or timeout_s <= 0 or backoff_s < 0:
        raise ValueError("need concurrency >= 1, retries >= 0, timeout_s > 0 and backoff_s >= 0")
    if deadline_s is not None and deadline_s <= 0:
        raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
    if group_indices is not None and len(group_indices) != len(rows):
        raise ValueError(f"group_indices has {len(group_indices)} entries for {len(rows)} rows")
    parsed = [row if isinstance(row, Row) else Row.model_validate(row) for row in rows]
    urls = replica_urls(environment_urls)
    names = [env_name_of(row, urls) for row in parsed]
    bodies = [(sampling.apply(row) if sampling else row).model_dump_json(exclude_unset=True) for row in parsed]
    groups = list(group_indices) if group_indices is not None else list(range(len(rows)))
    urls = await resolve_replicas(urls, lookup)
    semaphore = asyncio.Semaphore(concurrency)
    began = time.perf_counter()
    session = {
        "connector": aiohttp.TCPConnector(limit=concurrency),
        "cookie_jar": aiohttp.DummyCookieJar(),
        "timeout": aiohttp.ClientTimeout(total=None),  # each attempt is bounded by asyncio.wait_for(timeout_s)
    }

    async with aiohttp.ClientSession(**session) as client:

        async def explain_overflow(index: int) -> str:
            measured = await measure_prompt(client, generation_url, parsed[index]) if generation_url else None
            return prompt_too_long(measured)

        async def one(index: int) -> RolloutOutcome:
            replicas = urls[names[index]]
            first = index % len(replicas)
            targets = [replicas[(first + k) % len(replicas)].rstrip("/") + "/run" for k in range(len(replicas))]
            return await _run_with_retries(
                client,
                semaphore,
                targets,
                bodies[index],
                index,
                names[index],
                groups[index],
                timeout_s,
                retries,
                backoff_s,
                began,
                lambda: explain_overflow(index),
            )

        tasks = [asyncio.create_task(one(i)) for i in range(len(rows))]
        outcomes = await _outcomes_by_deadline(tasks, names, deadline_s)
    return batch_of(outcomes)


async def _outcomes_by_deadline(
    tasks: list[asyncio.Task[RolloutOutcome]], names: list[str], deadline_s: float | None
) -> list[RolloutOutcome]:
    """Wait for ``tasks`` (row by row) up to ``deadline_s``; their outcomes, those not done by then cancelled and
    reported as failed (with no attempts counted)."""
    if tasks:
        await asyncio.wait(tasks, timeout=deadline_s)
    outcomes = []
    for index, task in enumerate(tasks):
        if task.done():
            outcomes.append(task.result())
        else:
            task.cancel()
            error = f"abandoned: not done within the step's rollout deadline (rolloutDeadlineSeconds: {deadline_s:g}s)"
            outcomes.append(RolloutOutcome(index, names[index], attempts=0, error=error))
    await asyncio.gather(*tasks, return_exceptions=True)
    return outcomes


def batch_of(outcomes: list[RolloutOutcome]) -> RolloutBatch:
    """The batch of ``outcomes``: with the samples' metrics, the successful rollouts' timing and how many
    prompts were too long."""
    samples = [o.sample for o in outcomes if o.sample is not None]
    timed = [
        (o.started_s, o.finished_s) for o in outcomes if o.ok and o.started_s is not None and o.finished_s is not None
    ]
    metrics = rollout_metrics(samples, failed=len(outcomes) - len(samples)) | timing_metrics(timed)
    metrics |= reward_part_metrics(samples)
    metrics[PROMPT_TOO_LONG] = float(sum(o.prompt_too_long for o in outcomes))
    return RolloutBatch(outcomes, metrics)


async def _run_with_retries(
    client: aiohttp.ClientSession,
    semaphore: asyncio.Semaphore,
    targets: Sequence[str],
    body: str,
    index: int,
    env_name: str,
    group_index: int,
    timeout_s: float,
    retries: int,
    backoff_s: float,
    began: float,
    explain_overflow: Callable[[], Awaitable[str]],
) -> RolloutOutcome:
    error = ""
    sent = None

    def since_began() -> float:
        return time.perf_counter() - began

    for attempt in range(retries + 1):
        url = targets[attempt % len(targets)]
        if attempt:
            await asyncio.sleep(min(backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S))
        try:
            async with semaphore:
                sent = since_began()
                result = await asyncio.wait_for(_post_run(client, url, body), timeout_s)
            if overflowed_context(result):
                error = await explain_overflow()
                return RolloutOutcome(
                    index,
                    env_name,
                    attempt + 1,
                    error=error,
                    started_s=sent,
                    finished_s=since_began(),
                    prompt_too_long=True,
                )
            sample = result_to_sample(result, group_index)
            return RolloutOutcome(index, env_name, attempt + 1, sample=sample, started_s=sent, finished_s=since_began())
        except _Permanent as failure:
            return RolloutOutcome(
                index, env_name, attempt + 1, error=str(failure), started_s=sent, finished_s=since_began()
            )
        except RolloutConversionError as failure:
            error = f"bad rollout: {failure}"
            return RolloutOutcome(index, env_name, attempt + 1, error=error, started_s=sent, finished_s=since_began())
        except TimeoutError:
            error = f"POST {url} timed out after {timeout_s}s"
        except _Transient as failure:
            error = str(failure)
    error = f"{error} (gave up after {retries + 1} attempts)"
    return RolloutOutcome(index, env_name, retries + 1, error=error, started_s=sent, finished_s=since_began())


async def _post_run(client: aiohttp.ClientSession, url: str, body: str) -> RunResult:
    try:
        async with client.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
            status, text = response.status, await response.text()
    except aiohttp.ClientError as error:
        raise _Transient(f"POST {url} failed: {type(error).__name__}: {error}") from error
    if status == 500 and (inner := inner_client_error(text)) is not None:  # retrying cannot fix an inner 4xx
        raise _Permanent(f"POST {url} answered 500: {str(inner)[:ERROR_BODY_CHARS]}")
    if status in TRANSIENT_STATUS:
        raise _Transient(f"POST {url} answered {status}: {text[:ERROR_BODY_CHARS]}")
    if status != 200:  # a refusal in OpenAI's shape (a reward function that failed, say) is quoted by its message
        raise _Permanent(f"POST {url} answered {status}: {error_message(text)[:ERROR_BODY_CHARS]}")
    try:
        return RunResult.model_validate_json(text)
    except ValidationError as error:
        raise RolloutConversionError(
            f"POST {url} answered 200 with a body that is not a /run result: {describe(error)}"
        ) from None
