"""`grpojob train`: the trainer pod of a GRPOJob on Kubernetes, joining the job's RayCluster."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from grpojob_api import placement
from grpojob_api.endpoints import GENERATION_PORT, ContractError, TrainerEnv
from grpojob_api.progress import StoppedReport
from grpojob_trainer.commands.job import load_job, new_evaluation_token, read_evaluation_rows, read_training_prompts
from grpojob_trainer.errors import UsageError
from grpojob_trainer.training.stop import Interrupted, StopRequest, WorkerLost, trainer_pod_line

log = logging.getLogger("grpojob")


def train_in_cluster(config_path: Path, stop: StopRequest | None = None) -> int:
    """`grpojob train`: the trainer pod. Everything it needs comes from the endpoints ConfigMap and the Job.
    ``stop`` (its handlers installed) ends it early, raising `Interrupted` once the last completed step is
    checkpointed: on SIGTERM, the notice of an eviction, a drain or a preemption, within the pod's grace
    period. A Ray worker lost mid-run ends it too, raising `WorkerLost`; its retry waits for the worker's
    replacement pod."""
    from grpojob_trainer.cluster import connection
    from grpojob_trainer.cluster.rendezvous import current_endpoints, wait_for_environments
    from grpojob_trainer.cluster.workers import wait_for_workers
    from grpojob_trainer.observability import tracking
    from grpojob_trainer.observability.metrics import MetricSink, MetricsLogger
    from grpojob_trainer.observability.progress import ConfigMapProgressPublisher
    from grpojob_trainer.observability.prometheus import PrometheusMetrics
    from grpojob_trainer.policy.compilation import compile_cache_dir
    from grpojob_trainer.training.loop import run_loop
    from grpojob_trainer.training.placement import place_actors, watch_workers

    job = load_job(config_path)
    spec = job.spec
    try:
        endpoints = current_endpoints(os.environ)  # never an older attempt's
        pod = TrainerEnv.from_env(os.environ)
    except ContractError as error:
        raise UsageError(str(error)) from None
    sinks: list[MetricSink] = []
    if pod.metrics_port:
        exporter = PrometheusMetrics(job.metadata.name, spec.grpo.max_steps)
        exporter.serve(pod.metrics_port)
        sinks.append(exporter)
        log.info("training metrics on :%d/metrics", pod.metrics_port)
    stop = stop or StopRequest()
    gcs = connection.join(endpoints.ray_gcs_address)
    stop.reinstall()  # Ray's SIGTERM handler would print its stack dump first
    log.info("joined the Ray cluster; GCS address %s", gcs)
    head = connection.HeadWatch()
    dataset = read_training_prompts(spec, pod.dataset_paths)
    evaluation_rows = read_evaluation_rows(spec, pod.evaluation_dataset_path)
    evaluation_token = new_evaluation_token(spec)
    layout = placement.layout(spec)
    progress = ConfigMapProgressPublisher.in_cluster(pod.progress_config_map)
    watch = None
    try:
        # Placing the engines and ranks waits for the worker pods (and their images and GPUs): on a retry after a
        # lost worker, its replacement may wait for a node. A job that never gets them is ended by the operator's
        # deadline or stuck-pod checks, and this gives up after an hour.
        wait_for_workers(layout.ray_resources | ({"GPU": layout.gpus} if layout.gpus else {}), timeout_s=3600)
        placed = place_actors(
            layout,
            spec,
            pod.model_path,
            host="0.0.0.0",
            port=GENERATION_PORT,
            seed=spec.grpo.seed,
            evaluation_token=evaluation_token,
            timeout_s=3600,
            compile_cache_dir=compile_cache_dir(pod.checkpoint_dir),
        )
        watch = watch_workers(placed, stop)
        wait_for_environments(endpoints.environment_urls)
        run_dir = Path(pod.log_dir)
        sinks += tracking.tracking_sinks(job, endpoints.attempt, run_dir)
        log.info("logs of attempt %d in %s", endpoints.attempt, run_dir)
        with MetricsLogger(run_dir, sinks=sinks) as logger:
            asyncio.run(
                stop.watch(
                    run_loop(
                        job,
                        policy=placed.policy,
                        generation=placed.generation,
                        environment_urls=endpoints.environment_urls,
                        dataset=dataset,
                        logger=logger,
                        progress=progress,
                        checkpoint_dir=Path(pod.checkpoint_dir),
                        output_dir=Path(pod.output_dir),
                        before_step=head.check,
                        evaluation_rows=evaluation_rows,
                        evaluation_token=evaluation_token,
                        stop=stop,
                    )
                )
            )
    except (Interrupted, WorkerLost) as stopped:  # its line outlives the pod (a deleted pod takes its message)
        progress.publish_stopped(StoppedReport(endpoints.attempt, trainer_pod_line(stopped)))
        raise
    finally:
        if watch is not None:
            watch.stop()
        connection.disconnect(head)
    return 0
