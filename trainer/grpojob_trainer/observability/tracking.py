"""MLflow and Weights & Biases as `MetricSink`s (`spec.logging.mlflow`, `spec.logging.wandb`).

Each trainer attempt is one run, named `<job>-attempt-<n>`, with the job's spec as its parameters
(`job_params`: primitive values only, keyed by their path in the spec). The clients come from the
optional `tracking` extra (`pip install 'grpojob[tracking]'`) and are imported only when a job asks
for them. Credentials come from the environment, as the clients read them (`MLFLOW_TRACKING_USERNAME`,
`MLFLOW_TRACKING_PASSWORD`, `MLFLOW_TRACKING_TOKEN`, `WANDB_API_KEY`), which the operator fills from
the Secrets the job names.

A tracking server that cannot be reached when training starts fails the attempt (a wrong URI shows at
once); one that fails a step's write later costs that step's record there and a warning, not the run.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpojob_api import v1alpha1 as api
from grpojob_trainer.errors import UsageError
from grpojob_trainer.observability.metrics import MetricSink, Scalar, scalars

log = logging.getLogger(__name__)

MLFLOW_BATCH = 100
"""Most parameters or metrics MLflow takes in one `log_batch` (its limit is 100 parameters, 1000 metrics)."""
MLFLOW_PARAM_LENGTH = 6000
"""Longest parameter value MLflow stores."""


def job_params(job: api.GRPOJob) -> dict[str, Scalar]:
    """The job's spec as flat parameters: `grpo.maxSteps` → 16. Only primitive values (numbers, booleans,
    strings); lists and nulls are left out, as the metrics loggers leave out what is not a scalar."""
    flat: dict[str, Scalar] = {"name": job.metadata.name}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else key, item)
        elif isinstance(value, Scalar):
            flat[prefix] = value

    walk("", job.spec.model_dump(mode="json", by_alias=True))
    return flat


def run_name(job: api.GRPOJob, attempt: int) -> str:
    return f"{job.metadata.name}-attempt-{attempt}"


def _client_module(name: str, field: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        raise UsageError(
            f"{field} needs the {name} client, which this trainer lacks: install grpojob[tracking] "
            "(grpojob docs: guides/watching.md)"
        ) from None


class MlflowSink:
    """One MLflow run per attempt: the spec as parameters, every step's numbers as metrics."""

    def __init__(self, spec: api.MlflowSpec, job: api.GRPOJob, attempt: int) -> None:
        mlflow = _client_module("mlflow", "spec.logging.mlflow")
        from mlflow.entities import Param

        self._client = mlflow.MlflowClient(tracking_uri=spec.tracking_uri)
        experiment_name = spec.experiment or job.metadata.name
        experiment = self._client.get_experiment_by_name(experiment_name)
        experiment_id = experiment.experiment_id if experiment else self._client.create_experiment(experiment_name)
        tags = {"grpojob": job.metadata.name, "grpojob.attempt": str(attempt)}
        run = self._client.create_run(experiment_id, run_name=run_name(job, attempt), tags=tags)
        self.run_id: str = run.info.run_id
        params = [Param(key, str(value)[:MLFLOW_PARAM_LENGTH]) for key, value in job_params(job).items()]
        for start in range(0, len(params), MLFLOW_BATCH):
            self._client.log_batch(self.run_id, params=params[start : start + MLFLOW_BATCH])
        log.info("MLflow: run %s in experiment %r at %s", self.run_id, experiment_name, spec.tracking_uri)

    def log(self, step: int, metrics: Mapping[str, Scalar]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        numbers = [Metric(key, float(value), now, step) for key, value in metrics.items() if not isinstance(value, str)]
        try:
            for start in range(0, len(numbers), MLFLOW_BATCH):
                self._client.log_batch(self.run_id, metrics=numbers[start : start + MLFLOW_BATCH])
        except Exception as error:  # a tracking server's hiccup must not end the training
            log.warning("MLflow: could not log step %d: %s", step, error)

    def close(self, failed: bool = False) -> None:
        self._client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


class WandbSink:
    """One W&B run per attempt, grouped by job: the spec as its config, every step's scalars. Offline, the
    run's files go to ``<run_dir>/wandb`` (the attempt's log directory), for `wandb sync`."""

    def __init__(self, spec: api.WandbSpec, job: api.GRPOJob, attempt: int, run_dir: Path) -> None:
        wandb = _client_module("wandb", "spec.logging.wandb")
        self.run = wandb.init(
            project=spec.project,
            entity=spec.entity,
            mode=spec.mode.value,
            dir=str(run_dir),
            name=run_name(job, attempt),
            group=job.metadata.name,
            job_type="train",
            config=job_params(job),
            # The trainer's output stays the process's own (`kubectl logs`), not wrapped by W&B.
            settings=wandb.Settings(console="off"),
        )
        log.info("W&B: run %s (%s) in project %r", self.run.id, spec.mode.value, spec.project)

    def log(self, step: int, metrics: Mapping[str, Scalar]) -> None:
        try:
            self.run.log(dict(scalars(metrics)), step=step)
        except Exception as error:  # as for MLflow: never the end of the training
            log.warning("W&B: could not log step %d: %s", step, error)

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def tracking_sinks(job: api.GRPOJob, attempt: int, run_dir: Path) -> list[MetricSink]:
    """The sinks `spec.logging` asks for (MLflow, W&B), each with its run started."""
    logging_spec = job.spec.logging
    sinks: list[MetricSink] = []
    if logging_spec.mlflow is not None:
        sinks.append(MlflowSink(logging_spec.mlflow, job, attempt))
    if logging_spec.wandb is not None:
        sinks.append(WandbSink(logging_spec.wandb, job, attempt, run_dir))
    return sinks
