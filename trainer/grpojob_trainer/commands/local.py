"""`grpojob run`: a GRPOJob on this machine, with a local Ray head, the environment servers as processes (NeMo
Gym environments as containers of their image, under podman) and the policy and engine on this machine's GPUs
or its CPU."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from grpojob_api import hub, nemo_gym, paths, placement
from grpojob_api import v1alpha1 as api
from grpojob_api.placement import Layout
from grpojob_trainer.commands.job import load_job, new_evaluation_token, read_evaluation_rows, read_training_prompts
from grpojob_trainer.errors import UsageError
from grpojob_trainer.local import nemo_gym_containers
from grpojob_trainer.nemo_gym.protocol import Row
from grpojob_trainer.training.data import Prompts
from grpojob_trainer.training.stop import Interrupted, StopRequest

if TYPE_CHECKING:
    from grpojob_trainer.training.loop import LoopResult

log = logging.getLogger("grpojob")


def local_layout(spec: api.GRPOJobSpec, gpus: int) -> Layout:
    """Where `grpojob run` puts the engines and ranks on a machine of ``gpus`` GPUs: the job's layout, as on
    Kubernetes, its worker pods' GPUs all on this machine. Raises `UsageError` naming the fields when the
    machine has too few."""
    layout = placement.layout(spec)
    if layout.gpus <= gpus:
        return layout
    if gpus == 0:
        raise UsageError("spec.generation.gpusPerReplica / spec.training.gpusPerReplica: this machine has no GPU")
    if layout.colocated:
        raise UsageError(
            f"spec.training: {layout.ranks} policy ranks, each with an engine beside it (spec.placement: colocated), "
            f"need {layout.gpus} GPUs, this machine has {gpus}"
        )
    why = "spec.placement: split puts the engines and the policy's ranks on GPUs of their own"
    if spec.placement is None:  # split by default: say what made it so
        why = f"{'; '.join(spec.colocation_conflicts())}, so the engines and the policy's ranks need GPUs of their own"
    raise UsageError(f"{why}: {layout.gpus} GPUs, this machine has {gpus}")


def machine_gpus(layout: Layout) -> int:
    """This machine's GPUs, when the layout's workers ask for any (none for a CPU job, which never imports
    CUDA)."""
    if layout.gpus == 0:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def require(path: Path, field: str, hint: str) -> Path:
    if not path.exists():
        raise UsageError(f"{field}: {path} does not exist ({hint})")
    return path


def require_file(path: Path, field: str, hint: str) -> Path:
    if not require(path, field, hint).is_file():
        raise UsageError(f"{field}: {path} is not a file ({hint})")
    return path


def local_data(spec: api.GRPOJobSpec) -> tuple[Prompts, list[Row] | None]:
    """`grpojob run`'s training prompts and held-out rows, each source read from its file or, named by id, from
    this machine's hub cache (offline). Raises `UsageError` naming the field of a source it cannot read."""
    locations = [local_dataset(source, field) for field, source in spec.dataset_sources()]
    training = locations[: len(spec.dataset.all_sources())]
    return read_training_prompts(spec, training), read_evaluation_rows(spec, locations[-1] if spec.evaluation else None)


def local_dataset(source: api.DatasetSource, field: str) -> str:
    """Where `grpojob run` reads a source: its file, or the snapshot of its id in this machine's hub cache
    (`HF_HUB_CACHE`), which it never downloads. A ConfigMap is refused, naming the field."""
    if source.id is not None:
        from huggingface_hub import constants

        from grpojob_trainer.models.hub import HubError, download

        cache = constants.HF_HUB_CACHE
        try:
            found = download(source.id, source.revision, cache, repo_type="dataset", offline=True, field=field)
        except HubError as error:
            if error.reason != "DatasetNotInCache":
                raise UsageError(f"{field}.id: {error}") from None
            raise UsageError(
                f"{field}.id: this machine's hub cache ({cache}) does not hold the dataset {source.id} at revision "
                f"{source.revision or hub.DEFAULT_REVISION}, and `grpojob run` reads datasets from the cache only: "
                f"fill it with `hf download {source.id} --repo-type dataset` or `grpojob cache-dataset DIR {source.id}`"
            ) from None
        return str(found.path)
    if source.path is None:
        raise UsageError(
            f"{field}: `grpojob run` reads a local file or a dataset in this machine's hub cache: "
            f"set {field}.path or {field}.id"
        )
    hint = "write one with `grpojob dataset NAME --out FILE`"
    return str(require_file(Path(source.path), f"{field}.path", hint))


def local_model(model: api.ModelSpec) -> Path:
    """`grpojob run`'s model directory: ``path``, or the snapshot of ``id`` in this machine's hub cache
    (downloaded there first unless ``offline``)."""
    if model.path is not None:
        return require(Path(model.path), "spec.model.path", "write one with `grpojob tiny-model DIR`")
    from huggingface_hub import constants

    from grpojob_trainer.models.hub import HubError, download_model

    try:
        snapshot = download_model(str(model.id), model.revision, constants.HF_HUB_CACHE, offline=model.offline)
    except HubError as error:
        raise UsageError(f"spec.model.id: {error}") from None
    return snapshot.path


def run_local(
    job_path: Path, out: Path | None, show_progress: bool, tensorboard: bool = True, stop: StopRequest | None = None
) -> int:
    """`grpojob run`: the whole loop on this machine; ``stop`` (its handlers installed) ends it early, raising
    `Interrupted`, as a lost engine or policy rank does, raising `WorkerLost`."""
    import ray

    from grpojob_trainer.cluster import connection
    from grpojob_trainer.local.environment_processes import EnvironmentProcesses, local_rewards_env
    from grpojob_trainer.observability import tracking
    from grpojob_trainer.observability.console import StepDisplay
    from grpojob_trainer.observability.metrics import FileProgressPublisher, MetricsLogger
    from grpojob_trainer.policy.compilation import compile_cache_dir
    from grpojob_trainer.training.loop import run_loop
    from grpojob_trainer.training.placement import place_actors, watch_workers

    job = load_job(job_path)
    spec = job.spec
    nemo_gym_containers.check_can_run(spec)
    dataset, evaluation_rows = local_data(spec)
    for index, env in enumerate(spec.environments):  # a reward file missing here stops the run before Ray starts
        if env.rewards is not None:
            local_rewards_env(index, env.rewards)
    model = local_model(spec.model)
    out = out or Path("runs") / job.metadata.name
    out.mkdir(parents=True, exist_ok=True)
    evaluation_token = new_evaluation_token(spec)

    gpus = machine_gpus(placement.layout(spec))
    layout = local_layout(spec, gpus)
    reap_at_exit(spec)
    stop = stop or StopRequest()
    gcs = connection.start_local(layout.ray_resources, num_gpus=gpus)
    stop.reinstall()  # Ray's SIGTERM handler would print its stack dump first
    print(
        f"Ray is up (GCS {gcs}, {gpus} GPUs, {layout.placement} placement); loading the model from {model}", flush=True
    )
    watch = None
    try:
        placed = place_actors(
            layout,
            spec,
            str(model),
            host="127.0.0.1",
            port=None,
            seed=spec.grpo.seed,
            evaluation_token=evaluation_token,
            compile_cache_dir=compile_cache_dir(paths.checkpoint_dir(job)),
        )
        watch = watch_workers(placed, stop)
        generation, policy, base_urls = placed.generation, placed.policy, placed.generation.base_urls
        warn_of_idle_engines(spec, len(base_urls))
        processes = EnvironmentProcesses(
            [env for env in spec.environments if env.nemo_gym is None],
            policy_base_urls=base_urls,
            policy_model_name=spec.model.served_model_name,
            gcs_address=gcs,
            log_dir=out / "environments",
        )
        containers = nemo_gym_containers.NemoGymContainers(
            job, policy_base_url=base_urls[0], run_dir=out / "environments"
        )
        sinks = tracking.tracking_sinks(job, attempt=1, run_dir=out)
        with contextlib.ExitStack() as started:
            environment_urls = started.enter_context(processes) | started.enter_context(containers)
            environment_urls = nemo_gym.with_agent_names(spec.environments, environment_urls)
            logger = started.enter_context(MetricsLogger(out, tensorboard=tensorboard, sinks=sinks))
            name, steps = job.metadata.name, spec.grpo.max_steps
            display = started.enter_context(StepDisplay(name, steps, out / "run.log", bar=show_progress))

            result = asyncio.run(
                stop.watch(
                    run_loop(
                        job,
                        policy=policy,
                        generation=generation,
                        environment_urls=environment_urls,
                        dataset=dataset,
                        logger=logger,
                        progress=FileProgressPublisher(out / "progress.json"),
                        checkpoint_dir=Path(paths.checkpoint_dir(job)),
                        output_dir=Path(paths.output_dir(job)).resolve(),
                        on_step=display.on_step,
                        evaluation_rows=evaluation_rows,
                        evaluation_token=evaluation_token,
                        stop=stop,
                    )
                )
            )
    except Interrupted as interrupted:
        name_last_checkpoint(interrupted, job)
        raise
    finally:
        if watch is not None:
            watch.stop()
        ray.shutdown()
    print_summary(job, out, result)
    return 0


def name_last_checkpoint(interrupted: Interrupted, job: api.GRPOJob) -> None:
    """A run stopped before its loop (which resumes from the newest checkpoint) stopped at that checkpoint."""
    from grpojob_trainer.policy.checkpoint import list_checkpoints

    if interrupted.checkpoint is None and (saved := list_checkpoints(paths.checkpoint_dir(job))):
        interrupted.step, interrupted.checkpoint = saved[-1]


def warn_of_idle_engines(spec: api.GRPOJobSpec, engines: int) -> None:
    """Warn when some engines will get no requests: each local environment process calls one engine."""
    processes = sum(env.replicas for env in spec.environments if env.nemo_gym is None)
    if engines > max(processes, 1):
        log.warning(
            "%d engines but %d environment processes, each calling one engine: engines beyond them get no "
            "requests (set spec.environments[].replicas to %d or more)",
            engines,
            processes,
            engines,
        )


def print_summary(job: api.GRPOJob, out: Path, result: LoopResult) -> None:
    """What `grpojob run` ends with: the reward curve's summary, the evaluations, the failed rollouts, and
    where the model, the curve and the logs are."""
    from grpojob_trainer.observability import report

    spec = job.spec
    curve = report.reward_curve(out / "metrics.jsonl")
    evaluations = report.reward_curve(out / "metrics.jsonl", report.EVALUATION_REWARD_KEY)
    title = f"{job.metadata.name}: mean reward per step"
    png = report.plot_reward_curve(curve, out / "reward.png", title, evaluations)
    print(f"trained steps {result.first_step} to {result.last_step}: {report.summary(curve)}")
    if spec.evaluation is not None:
        print(report.evaluation_summary(evaluations))
    print(f"failed rollouts: {result.failed_rollouts}")
    print(f"trained model: {Path(paths.output_dir(job)) / paths.FINAL_MODEL_DIR}  (vllm serve DIR)")
    print(f"reward curve: {png}")
    print(f"TensorBoard logs: {out}  (tensorboard --logdir {out})")


def reap_at_exit(spec: api.GRPOJobSpec) -> None:
    """Ray's processes and the environment servers end with this process, however it ends, and its NeMo Gym
    containers are removed."""
    from grpojob_trainer.local import reaper

    gym_containers = (
        nemo_gym_containers.remove_command(os.getpid()) if nemo_gym_containers.nemo_gym_environments(spec) else []
    )
    reaper.reap_children_at_exit(then=gym_containers)
