"""The `grpojob` command.

grpojob run JOB.yaml          run a GRPOJob on this machine: local Ray, environment servers as
                              processes, the transformers backend; the YAML `kubectl apply` takes
grpojob train --config FILE   the trainer pod's entrypoint on Kubernetes (joins the job's RayCluster)
grpojob tiny-model DIR        write a tiny random-init model (with tokenizer and chat template)
grpojob export CKPT OUT       write a checkpoint's model as a Hugging Face model directory (--adapter: a LoRA adapter)
grpojob download REPO...      download what a job names by id into a hub cache (a job's download step)
grpojob download-model ID     download a Hugging Face model into a hub cache
grpojob cache-model DIR ID    put a local model directory into a hub cache as ID (air-gapped clusters)
grpojob cache-dataset DIR ID  put a local dataset directory into a hub cache as ID (air-gapped clusters)
grpojob dataset NAME --out F  write an example environment's JSONL rows
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import secrets
import sys
import traceback
from pathlib import Path

import yaml
from pydantic import ValidationError

from grpojob_api import admission, hub, kubeyaml, paths
from grpojob_api import v1alpha1 as api
from grpojob_api.endpoints import GENERATION_PORT, ContractError, TrainerEnv
from grpojob_trainer.algorithm.data import Prompts
from grpojob_trainer.errors import AllRolloutsFailed, EnvironmentNotReady, RayHeadLost, UsageError
from grpojob_trainer.models.tiny import SHAPES
from grpojob_trainer.nemo_gym.protocol import Row

log = logging.getLogger("grpojob")

TERMINATION_LOG = Path("/dev/termination-log")
"""Where Kubernetes reads a container's termination message (the trainer pod's is its status's reason)."""
TERMINATION_MESSAGE_LIMIT = 1024


def load_job(path: Path) -> api.GRPOJob:
    """Read and validate a GRPOJob YAML file as `kubectl apply` would; errors name the field."""
    try:
        manifest = kubeyaml.load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise UsageError(f"{path}: {error}") from None
    try:
        return admission.parse_job(manifest)
    except ValidationError as error:
        raise UsageError(f"{path}: invalid GRPOJob: {admission.describe(error)}") from None


def _no_nemo_gym_environments(spec: api.GRPOJobSpec) -> None:
    """`grpojob run` starts environments as processes of this Python; NeMo Gym's servers need their own."""
    for index, env in enumerate(spec.environments):
        if env.nemo_gym is not None:
            raise UsageError(
                f"spec.environments[{index}].nemoGym: `grpojob run` cannot start NeMo Gym environments: nemo-gym "
                "needs Python >= 3.12 and its servers' virtual environments, and its Ray must be the job's "
                "(same Python and Ray versions); they run in the NeMo Gym image on Kubernetes (README: "
                "NeMo Gym environments)"
            )


def _local_gpus(spec: api.GRPOJobSpec) -> int:
    """GPUs `grpojob run` uses: this machine's, when the spec asks for any (none for a CPU job)."""
    wants = spec.generation.gpus_per_replica > 0 or spec.training.gpus_per_replica > 0
    if not wants:
        return 0
    import torch

    if not torch.cuda.is_available():
        raise UsageError("spec.generation.gpusPerReplica / spec.training.gpusPerReplica: this machine has no GPU")
    return torch.cuda.device_count()


def _local_policy(spec: api.GRPOJobSpec, gpus: int) -> tuple[int, float]:
    """`grpojob run`'s policy: its ranks and each one's GPUs. Without GPUs, one gloo rank per
    training replica; with one GPU, one rank sharing it with the engine (so no asynchronous GRPO); with
    more, one rank per GPU asked for (`spec.training.ranks`), the engine on a GPU of its own."""
    training = spec.training
    if gpus == 0:
        return training.replicas, 0
    world = training.ranks
    if gpus == 1:
        if world > 1:
            raise UsageError(f"spec.training: {world} policy ranks need {world + 1} GPUs here, this machine has 1")
        if spec.grpo.max_off_policy_steps > 0:
            raise UsageError(
                f"spec.grpo.maxOffPolicySteps: {spec.grpo.max_off_policy_steps} overlaps generation with training, "
                "which needs the engine on a GPU of its own; with one GPU `grpojob run` puts the engine and the "
                "policy on the same one: set maxOffPolicySteps: 0 here, or run on 2 GPUs"
            )
        return 1, 0.5
    if world + 1 > gpus:
        raise UsageError(
            f"spec.training: {world} policy ranks and the engine need {world + 1} GPUs, this machine has {gpus}"
        )
    return world, 1


def _require(path: Path, field: str, hint: str) -> Path:
    if not path.exists():
        raise UsageError(f"{field}: {path} does not exist ({hint})")
    return path


def _require_file(path: Path, field: str, hint: str) -> Path:
    if not _require(path, field, hint).is_file():
        raise UsageError(f"{field}: {path} is not a file ({hint})")
    return path


def _evaluation_rows(spec: api.GRPOJobSpec, location: str | None) -> list[Row] | None:
    """The held-out rows of ``spec.evaluation`` (its first ``maxRows``) read from ``location`` (a file or a hub
    dataset's snapshot); None without an evaluation. Raises `UsageError` naming the field for rows it cannot
    read."""
    from grpojob_trainer.algorithm.sources import load_rows

    evaluation = spec.evaluation
    if evaluation is None:
        return None
    if location is None:
        raise UsageError("spec.evaluation.dataset: the trainer was given no place to read it from")
    try:
        rows = load_rows(evaluation.dataset, location, "spec.evaluation.dataset")
    except ValueError as error:
        raise UsageError(str(error)) from None
    return rows[: evaluation.max_rows]


def _training_prompts(spec: api.GRPOJobSpec, locations: list[str]) -> Prompts:
    """The training prompts of ``spec.dataset``, each source read from its place in ``locations``. Raises
    `UsageError` naming the field for rows it cannot read."""
    from grpojob_trainer.algorithm.sources import load_prompts

    try:
        return load_prompts(spec.dataset, locations, spec.grpo.seed)
    except ValueError as error:
        raise UsageError(str(error)) from None


def local_data(spec: api.GRPOJobSpec) -> tuple[Prompts, list[Row] | None]:
    """`grpojob run`'s training prompts and held-out rows, each source read from its file or, named by id, from
    this machine's hub cache (offline). Raises `UsageError` naming the field of a source it cannot read."""
    locations = [_local_dataset(source, field) for field, source in spec.dataset_sources()]
    training = locations[: len(spec.dataset.all_sources())]
    return _training_prompts(spec, training), _evaluation_rows(spec, locations[-1] if spec.evaluation else None)


def _local_dataset(source: api.DatasetSource, field: str) -> str:
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
    return str(_require_file(Path(source.path), f"{field}.path", hint))


def _evaluation_token(spec: api.GRPOJobSpec) -> str | None:
    """A fresh secret that marks this run's evaluation requests (none without an evaluation)."""
    return secrets.token_urlsafe(24) if spec.evaluation is not None else None


def _local_model(model: api.ModelSpec) -> Path:
    """`grpojob run`'s model directory: ``path``, or the snapshot of ``id`` in this machine's hub cache
    (downloaded there first unless ``offline``)."""
    if model.path is not None:
        return _require(Path(model.path), "spec.model.path", "write one with `grpojob tiny-model DIR`")
    from huggingface_hub import constants

    from grpojob_trainer.models.hub import HubError, download_model

    try:
        snapshot = download_model(str(model.id), model.revision, constants.HF_HUB_CACHE, offline=model.offline)
    except HubError as error:
        raise UsageError(f"spec.model.id: {error}") from None
    return snapshot.path


def download_step(model_id: str, revision: str | None, cache: Path, termination_log: Path | None) -> int:
    """`grpojob download-model`: download one model. Prints (and writes to ``termination_log``) `{"commit": …}`
    as JSON, or the reason it failed."""
    import json

    from grpojob_trainer.models.hub import HubError, download_model

    try:
        snapshot = download_model(model_id, revision, cache)
    except HubError as error:
        report, code = {"reason": error.reason, "message": str(error)}, 1
    else:
        report, code = {"commit": snapshot.commit, "path": str(snapshot.path)}, 0
    text = json.dumps(report)
    print(text, flush=True)
    if termination_log is not None:
        termination_log.write_text(text)
    return code


def download_repos(arguments: list[str], cache: Path, termination_log: Path | None) -> int:
    """`grpojob download`: the download step of a job, one repository (`grpojob_api.hub.HubRepo`, JSON) per
    argument, each with its own revision, token and offline switch. Prints (and writes to ``termination_log``,
    where the operator reads it) the commit of each, in order, as a `DownloadReport`; or why the first that
    failed did."""
    from grpojob_trainer.models.hub import HubError, download

    try:
        repos = [hub.HubRepo.parse(argument) for argument in arguments]
    except ValueError as error:
        raise UsageError(str(error)) from None
    commits = []
    try:
        for repo in repos:
            token = os.environ.get(repo.token_env) if repo.token_env else None
            if repo.token_env and not token and not repo.offline:
                raise HubError("HubTokenMissing", f"{repo.field}.tokenSecret: {repo.token_env} is empty")
            snapshot = download(
                repo.id,
                repo.revision,
                cache,
                repo_type=repo.kind,
                offline=repo.offline,
                token=token,
                files=repo.files,
                field=repo.field,
            )
            log.info("%s %s at revision %s: commit %s", repo.kind, repo.id, repo.revision, snapshot.commit)
            commits.append(snapshot.commit)
    except HubError as error:
        report, code = hub.DownloadReport(reason=error.reason, message=str(error)), 1
    else:
        report, code = hub.DownloadReport(commits=commits), 0
    print(report.text(), flush=True)
    if termination_log is not None:
        termination_log.write_text(report.text())
    return code


def write_termination_message(path: Path | None, reason: str) -> None:
    """Leave ``reason``, in one line, as the container's termination message at ``path``, where the operator
    reads why the pod failed into the GRPOJob's status. Nothing outside a pod: only a ``path`` that exists
    (the kubelet creates it) is written."""
    if path is None or not path.exists():
        return
    try:
        path.write_text(" ".join(reason.split())[:TERMINATION_MESSAGE_LIMIT])
    except OSError as error:
        log.warning("could not write the termination message to %s: %s", path, error)


def _failed(reason: str, termination_log: Path | None) -> None:
    """Report a fatal error the command knows: one line on stderr (no traceback), and the termination message."""
    print(f"grpojob: {reason}", file=sys.stderr)
    write_termination_message(termination_log, reason)


def run_local(job_path: Path, out: Path | None, show_progress: bool, tensorboard: bool = True) -> int:
    """`grpojob run`: the whole loop on this machine."""
    import ray
    from tqdm import tqdm

    from grpojob_trainer.algorithm.loop import run_loop
    from grpojob_trainer.observability import report, tracking
    from grpojob_trainer.observability.metrics import FileProgressPublisher, MetricsLogger
    from grpojob_trainer.ray_runtime import connection, reaper
    from grpojob_trainer.ray_runtime.local_environments import EnvironmentProcesses

    job = load_job(job_path)
    spec = job.spec
    _no_nemo_gym_environments(spec)
    dataset, evaluation_rows = local_data(spec)
    model = _local_model(spec.model)
    out = out or Path("runs") / job.metadata.name
    out.mkdir(parents=True, exist_ok=True)
    evaluation_token = _evaluation_token(spec)
    if spec.generation.replicas > 1:
        log.warning("grpojob run serves one generation engine (spec.generation.replicas=%d)", spec.generation.replicas)
    spec_json = spec.model_dump(mode="json", by_alias=True)

    gpus = _local_gpus(spec)
    world, policy_gpus = _local_policy(spec, gpus)
    reaper.reap_children_at_exit()  # Ray's processes and the environment servers end with this one
    gcs = connection.start_local(generation_replicas=1, policy_replicas=world, num_gpus=gpus)
    print(f"Ray is up (GCS {gcs}, {gpus} GPUs); loading the model from {model}", flush=True)
    try:
        # One engine and the policy's ranks. With one GPU they share it (colocated: half each, the engine
        # taking spec.generation.gpuMemoryUtilization of its memory); without GPUs all run on the CPU.
        share = 0.5 if gpus == 1 else min(1, gpus)
        engines = connection.place_generation(
            1, share, spec_json, str(model), "127.0.0.1", None, spec.grpo.seed, evaluation_token
        )
        policy = connection.place_policy(world, policy_gpus, spec_json, str(model), spec.grpo.seed)
        base_url = ray.get(engines[0].base_url.remote())
        environments = EnvironmentProcesses(
            spec.environments,
            policy_base_url=base_url,
            policy_model_name=spec.model.served_model_name,
            gcs_address=gcs,
            log_dir=out / "environments",
        )
        sinks = tracking.tracking_sinks(job, attempt=1, run_dir=out)
        with environments as env_urls, MetricsLogger(out, tensorboard=tensorboard, sinks=sinks) as logger:
            bar = tqdm(total=spec.grpo.max_steps, desc=job.metadata.name, unit="step", disable=not show_progress)

            def on_step(step: int, metrics: dict[str, float]) -> None:
                bar.n = step
                bar.set_postfix(reward=f"{metrics.get('rollout/reward/mean', float('nan')):.3f}", refresh=True)

            result = asyncio.run(
                run_loop(
                    job,
                    policy=policy,
                    engines=engines,
                    env_urls=env_urls,
                    dataset=dataset,
                    logger=logger,
                    progress=FileProgressPublisher(out / "progress.json"),
                    checkpoint_dir=Path(paths.checkpoint_dir(job)),
                    output_dir=Path(paths.output_dir(job)).resolve(),
                    on_step=on_step,
                    evaluation_rows=evaluation_rows,
                    evaluation_token=evaluation_token,
                )
            )
            bar.close()
    finally:
        ray.shutdown()
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
    return 0


def train_in_cluster(config_path: Path) -> int:
    """`grpojob train`: the trainer pod. Everything it needs comes from the endpoints ConfigMap and the Job."""
    import ray

    from grpojob_trainer.algorithm.loop import run_loop
    from grpojob_trainer.observability import tracking
    from grpojob_trainer.observability.metrics import MetricSink, MetricsLogger
    from grpojob_trainer.observability.progress import ConfigMapProgressPublisher
    from grpojob_trainer.observability.prometheus import PrometheusMetrics
    from grpojob_trainer.ray_runtime import connection
    from grpojob_trainer.ray_runtime.local_environments import wait_for_environments
    from grpojob_trainer.ray_runtime.rendezvous import current_endpoints

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
    gcs = connection.join(endpoints.ray_gcs_address)
    log.info("joined the Ray cluster; GCS address %s", gcs)
    head = connection.HeadWatch()
    spec_json = spec.model_dump(mode="json", by_alias=True)
    dataset = _training_prompts(spec, pod.dataset_paths)
    evaluation_rows = _evaluation_rows(spec, pod.evaluation_dataset_path)
    evaluation_token = _evaluation_token(spec)
    try:
        generation, training = spec.generation, spec.training
        engines = connection.place_generation(
            generation.replicas,
            generation.gpus_per_replica,
            spec_json,
            pod.model_path,
            "0.0.0.0",
            GENERATION_PORT,
            spec.grpo.seed,
            evaluation_token,
        )
        # One rank per GPU of the `policy` workers (one per worker on the CPU). Placing them waits for the
        # worker pods (and their images and GPUs); a job that never gets them is ended by the operator's
        # deadline or stuck-pod checks, and this gives up after an hour.
        policy = connection.place_policy(
            training.ranks,
            min(1, training.gpus_per_replica),
            spec_json,
            pod.model_path,
            spec.grpo.seed,
            timeout_s=3600,
        )
        ray.get([engine.base_url.remote() for engine in engines], timeout=3600)
        wait_for_environments(endpoints.environment_urls)
        run_dir = Path(pod.log_dir)
        sinks += tracking.tracking_sinks(job, endpoints.attempt, run_dir)
        log.info("logs of attempt %d in %s", endpoints.attempt, run_dir)
        with MetricsLogger(run_dir, sinks=sinks) as logger:
            asyncio.run(
                run_loop(
                    job,
                    policy=policy,
                    engines=engines,
                    env_urls=endpoints.environment_urls,
                    dataset=dataset,
                    logger=logger,
                    progress=ConfigMapProgressPublisher.in_cluster(pod.progress_config_map),
                    checkpoint_dir=Path(pod.checkpoint_dir),
                    output_dir=Path(pod.output_dir),
                    before_step=head.check,
                    evaluation_rows=evaluation_rows,
                    evaluation_token=evaluation_token,
                )
            )
    finally:
        connection.disconnect(head)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grpojob", description="GRPO post-training, on Kubernetes or this machine.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a GRPOJob YAML on this machine")
    run.add_argument("job", type=Path)
    run.add_argument("--out", type=Path, help="where metrics, TensorBoard logs and the reward curve go")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--no-tensorboard", action="store_true", help="metrics to JSONL only")
    train = commands.add_parser("train", help="the trainer pod's entrypoint")
    train.add_argument("--config", type=Path, required=True)
    train.add_argument(
        "--termination-log",
        type=Path,
        default=TERMINATION_LOG,
        help="write why the trainer failed here, when it exists (the container's termination message)",
    )
    tiny = commands.add_parser("tiny-model", help="write a tiny random-init model directory")
    tiny.add_argument("out", type=Path)
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--hidden-size", type=int, default=128, help="256 with --heads 4 gives vLLM's head_dim 64")
    tiny.add_argument("--heads", type=int, default=4)
    tiny.add_argument("--shape", choices=list(SHAPES), help="a named shape (overrides --hidden-size/--heads)")
    export = commands.add_parser("export", help="write a checkpoint's model as a Hugging Face model directory")
    export.add_argument("checkpoint", type=Path, help="a step_* checkpoint, or a checkpoint directory (its newest)")
    export.add_argument("out", type=Path)
    export.add_argument(
        "--base",
        type=Path,
        help="the model the job started from (for older checkpoints, and a LoRA checkpoint's base when it moved)",
    )
    export.add_argument(
        "--adapter",
        action="store_true",
        help="a LoRA checkpoint: write the PEFT adapter directory (`vllm serve BASE --enable-lora`) instead of merging",
    )
    export.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    export.add_argument("--max-shard-size", default="5GB", help="safetensors shards of at most this size")
    repos = commands.add_parser("download", help="download what a job names by id into a hub cache (its download step)")
    repos.add_argument("repos", nargs="+", metavar="REPO", help="a repository to download, as JSON (grpojob_api.hub)")
    repos.add_argument("--cache", type=Path, required=True, help="the hub cache directory")
    repos.add_argument("--termination-log", type=Path, help="also write the result here")
    download = commands.add_parser("download-model", help="download a Hugging Face model into a hub cache")
    download.add_argument("model_id")
    download.add_argument("--revision")
    download.add_argument("--cache", type=Path, required=True, help="the hub cache directory")
    download.add_argument("--termination-log", type=Path, help="also write the result here")
    place = commands.add_parser("cache-model", help="put a local model directory into a hub cache as MODEL_ID")
    place.add_argument("model_dir", type=Path)
    place.add_argument("model_id")
    place.add_argument("--revision", default="main")
    place.add_argument("--cache", type=Path, required=True, help="the hub cache directory")
    place_dataset = commands.add_parser(
        "cache-dataset", help="put a local dataset directory (data files, a card) into a hub cache as DATASET_ID"
    )
    place_dataset.add_argument("dataset_dir", type=Path)
    place_dataset.add_argument("dataset_id")
    place_dataset.add_argument("--revision", default="main")
    place_dataset.add_argument("--cache", type=Path, required=True, help="the hub cache directory")
    data = commands.add_parser("dataset", help="write an example environment's rows")
    data.add_argument("name")
    data.add_argument("--rows", type=int, default=256)
    data.add_argument("--seed", type=int, default=0)
    data.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    termination_log: Path | None = getattr(args, "termination_log", None)
    try:
        if args.command == "run":
            return run_local(
                args.job, args.out, show_progress=not args.no_progress, tensorboard=not args.no_tensorboard
            )
        if args.command == "train":
            return train_in_cluster(args.config)
        if args.command == "export":
            from grpojob_trainer.policy.export import export_checkpoint

            try:
                out = export_checkpoint(
                    args.checkpoint,
                    args.out,
                    base=args.base,
                    dtype=args.dtype,
                    max_shard_size=args.max_shard_size,
                    adapter=args.adapter,
                )
            except (FileNotFoundError, ValueError) as error:
                raise UsageError(str(error)) from None
            print(out)
            return 0
        if args.command == "download":
            return download_repos(args.repos, args.cache, args.termination_log)
        if args.command == "download-model":
            return download_step(args.model_id, args.revision, args.cache, args.termination_log)
        if args.command == "cache-model":
            from grpojob_trainer.models.hub import place_in_cache

            print(place_in_cache(args.model_dir, args.model_id, args.cache, args.revision).path)
            return 0
        if args.command == "cache-dataset":
            from grpojob_trainer.models.hub import place_in_cache

            try:
                placed = place_in_cache(args.dataset_dir, args.dataset_id, args.cache, args.revision, "dataset")
            except FileNotFoundError as error:
                raise UsageError(str(error)) from None
            print(placed.path)
            return 0
        if args.command == "tiny-model":
            from grpojob_trainer.models.tiny import TinyModelConfig, write_tiny_model

            if args.shape is not None:
                config = dataclasses.replace(SHAPES[args.shape], seed=args.seed)
            else:
                config = TinyModelConfig(
                    hidden_size=args.hidden_size,
                    intermediate_size=3 * args.hidden_size,
                    num_attention_heads=args.heads,
                    num_key_value_heads=max(1, args.heads // 2),
                    seed=args.seed,
                )
            print(write_tiny_model(args.out, config))
            return 0
        from grpojob_trainer.environments.dataset import write_rows

        print(write_rows(args.name, args.rows, args.out, args.seed))
        return 0
    except UsageError as error:
        _failed(str(error), termination_log)
        return 2
    except (AllRolloutsFailed, EnvironmentNotReady) as error:
        _failed(str(error), termination_log)
        return 1
    except RayHeadLost as error:
        _failed(str(error), termination_log)
        from grpojob_trainer.ray_runtime.connection import exit_without_ray

        exit_without_ray(1)
    except Exception as error:  # a bug or an unexpected failure: its traceback goes to the log
        exception = "".join(traceback.format_exception_only(error)).strip().splitlines()
        write_termination_message(termination_log, exception[-1] if exception else type(error).__name__)
        raise


if __name__ == "__main__":
    sys.exit(main())
