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
import dataclasses
import logging
import shlex
import sys
import traceback
from pathlib import Path

from grpojob_api.progress import CANNOT_RUN_EXIT_CODE, WORKER_LOST_EXIT_CODE
from grpojob_trainer.cluster.connection import ask_for_token_auth
from grpojob_trainer.commands.downloads import download_repos, download_step
from grpojob_trainer.commands.local import run_local
from grpojob_trainer.commands.train import train_in_cluster
from grpojob_trainer.errors import AllRolloutsFailed, EnvironmentNotReady, RayHeadLost, UsageError, cannot_run
from grpojob_trainer.models.tiny import SHAPES
from grpojob_trainer.observability.console import LOG_FORMAT, wants_bar
from grpojob_trainer.training.stop import Interrupted, StopRequest, WorkerLost, trainer_pod_line

log = logging.getLogger("grpojob")

TERMINATION_LOG = Path("/dev/termination-log")
"""Where Kubernetes reads a container's termination message (the trainer pod's is its status's reason)."""
TERMINATION_MESSAGE_LIMIT = 1024


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


def _interrupted(interrupted: Interrupted, command: str, argv: list[str], termination_log: Path | None) -> None:
    """Report a run stopped by a signal in one line: where it stopped, its checkpoint, and (on this machine) the
    command that resumes from it; the trainer pod's line is its termination message, the job's status."""
    if command == "train":
        _failed(trainer_pod_line(interrupted), termination_log)
        return
    print(f"grpojob: interrupted {interrupted.where()}; resume with: {shlex.join(['grpojob', *argv])}", file=sys.stderr)


def _worker_lost(lost: WorkerLost, command: str, argv: list[str], termination_log: Path | None) -> None:
    """Report a run ended by a lost Ray worker in one line: which, where, what happened and where the run resumes
    (the trainer pod's retry, or on this machine the command that resumes it)."""
    line = trainer_pod_line(lost) if command == "train" else lost.reason(shlex.join(["grpojob", *argv]))
    _failed(line, termination_log)


def build_parser() -> argparse.ArgumentParser:
    """The `grpojob` command's arguments: one subcommand each for running, training, exporting and downloading."""
    parser = argparse.ArgumentParser(prog="grpojob", description="GRPO post-training, on Kubernetes or this machine.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a GRPOJob YAML on this machine")
    run.add_argument("job", type=Path)
    run.add_argument("--out", type=Path, help="where metrics, TensorBoard logs and the reward curve go")
    run.add_argument("--no-progress", action="store_true", help="no progress bar: one log line a step")
    run.add_argument(
        "--verbose", action="store_true", help="every log line on the screen, one a step, instead of the progress bar"
    )
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
    return parser


def main(argv: list[str] | None = None) -> int:
    """`grpojob`: parse the arguments, run the subcommand, and report a failure the user can act on in one line
    (exit status 2 for a usage error, 1 for a run that failed, 75 for one whose Ray worker's node left the
    cluster, 78 for a job that cannot run as specified or packaged, 128 + the signal's number for one stopped on
    a signal), a bug with its traceback."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    termination_log: Path | None = getattr(args, "termination_log", None)
    try:
        return run_command(args)
    except UsageError as error:
        _failed(str(error), termination_log)
        return 2
    except Interrupted as interrupted:
        _interrupted(interrupted, args.command, sys.argv[1:] if argv is None else argv, termination_log)
        return interrupted.exit_code
    except WorkerLost as lost:
        _worker_lost(lost, args.command, sys.argv[1:] if argv is None else argv, termination_log)
        return WORKER_LOST_EXIT_CODE if lost.lost.node_gone else 1
    except (AllRolloutsFailed, EnvironmentNotReady) as error:
        _failed(str(error), termination_log)
        return 1
    except RayHeadLost as error:
        _failed(str(error), termination_log)
        from grpojob_trainer.cluster.connection import exit_without_ray

        exit_without_ray(1)
    except Exception as error:  # a bug or an unexpected failure: its traceback goes to the log
        if (reason := cannot_run(error)) is not None:
            _failed(str(reason), termination_log)
            return CANNOT_RUN_EXIT_CODE
        exception = "".join(traceback.format_exception_only(error)).strip().splitlines()
        write_termination_message(termination_log, exception[-1] if exception else type(error).__name__)
        raise


def run_command(args: argparse.Namespace) -> int:
    """Run the subcommand ``args`` names; its exit status."""
    if args.command == "run":
        # Before anything imports Ray, which reads its authentication mode once, at import.
        ask_for_token_auth()
        bar = wants_bar(sys.stderr, verbose=args.verbose, no_progress=args.no_progress)
        with StopRequest().installed() as stop:
            return run_local(args.job, args.out, show_progress=bar, tensorboard=not args.no_tensorboard, stop=stop)
    if args.command == "train":
        with StopRequest().installed() as stop:
            return train_in_cluster(args.config, stop=stop)
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


if __name__ == "__main__":
    sys.exit(main())
