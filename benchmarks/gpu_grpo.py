"""GPU benchmark of the GRPO path on one H200, every leg against its anchor measured in the same run.

    python benchmarks/gpu_grpo.py all --out runs/bench-gpu            # every leg, then the table
    python benchmarks/gpu_grpo.py LEG --out runs/bench-gpu            # one leg (writes LEG.json)
    python benchmarks/gpu_grpo.py table --out runs/bench-gpu          # the Markdown table of what ran
    python benchmarks/gpu_grpo.py prepare --out runs/bench-gpu        # only write the model and the rows

Legs (each in a process of its own, so one engine's memory is gone before the next starts):

- ``generation-raw``: vLLM's offline `LLM.generate` on token-id prompts: the anchor.
- ``generation-http``: the same prompts as chat messages through our OpenAI-compatible server (vLLM
  async engine behind it), all requests in flight at once from another process, as the environment
  servers send them.
  Both legs sample identically (temperature 1, top-p 1, the sampled token's log-probability).
- ``grpo-ours``: ``grpojob run`` of a GRPOJob with the model below and the arithmetic environment;
  policy and vLLM engine share GPU 0 (weights by CUDA IPC). ``grpo-ours-2gpu``: the same job with the
  policy on one GPU and the engine on another (weights by NCCL broadcast); ``grpo-ours-2gpu-async``: that
  job with ``maxOffPolicySteps: 1`` (the next step's rollouts generated while a step trains).
- ``grpo-trl``: TRL's `GRPOTrainer` (vLLM colocated, bf16) on the same model, rows, group size,
  completion length, micro-batch and one optimizer step per batch of generations: the anchor. Besides the
  step, its phases: generation and scoring (`_generate_and_score_completions`, vLLM's sampling inside it)
  and the rest of the step (training).
- ``grpo-verl``: verl's GRPO trainer (`python -m verl.trainer.main_ppo`, pinned in
  ``benchmarks/device/verl-wheels.txt``) with its hybrid engine: the FSDP actor and the vLLM rollout share the GPU.
  The same model, rows, group size, completion length, learning rate, micro-batch (as a token budget), LoRA rank
  and targets, and the arithmetic reward as a verl reward function (a file the leg writes). verl's speed settings,
  named in the result's ``settings``: padding removal (``use_remove_padding``), dynamic batch size
  (``use_dynamic_bsz``, ``ppo_max_token_len_per_gpu``), its vLLM memory share (``rollout.gpu_memory_utilization``,
  ``verl_gpu_memory_utilization``), FSDP2; what it cannot match, and why, in ``notes``. Its phases are verl's own
  metrics: ``timing_s/step``, ``timing_s/gen``, ``timing_s/update_actor``. ``table`` sets TRL, verl and ours side
  by side.
- ``generation-breakdown``: where the GRPO step's generation phase goes. The same rollouts as
  ``grpo-ours`` (32 prompts x 8 through the arithmetic environment server, the engine with the colocated
  job's memory share, the prefix cache dropped before each step as a weight load does) without training
  between the steps; the driver (`collect_rollouts`) in a process of its own, as in ``grpojob run``. Per step:
  the phase's wall time; the engine window (first request in to last response out at the generation server);
  the head (driver start to the first request at the server) and the end (last response to the driver
  done): the environment hops around the engine; each request's time at the server against each
  rollout's time at the driver (their difference: the HTTP/environment hops of one rollout); the tail
  (90th-percentile rollout to the last). Then ``generation-replay`` (a process of its own) replays every
  step's exact prompt token ids and output lengths on vLLM's offline `LLM` with the same engine settings
  (``max_tokens = min_tokens = n``, ``ignore_eos``), once in full and once prefill only (one token each):
  the decode floor for the same work, and how much of it prefill is.

The model is random-init with the dimensions of Qwen2.5-1.5B (``grpojob tiny-model --shape``), written
under ``--out`` on first use. Step times are medians over the steps after the first (warm-up).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import multiprocessing
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BF16_PEAK_TFLOPS = 790.0
"""Dense bf16 matmul peak measured on this H200 (see docs/benchmarks.md): the MFU denominator."""


@dataclass(frozen=True)
class Workload:
    shape: str = "qwen2.5-1.5b"
    # generation legs
    prompts: int = 256
    prompt_tokens: int = 512
    new_tokens: int = 512
    gpu_memory_utilization: float = 0.85
    # GRPO legs
    prompts_per_step: int = 32
    generations_per_prompt: int = 8
    max_new_tokens: int = 256
    micro_batch_size: int = 16
    torch_compile: str = ""
    """Our leg: `spec.training.torchCompile` (decoder layers through torch.compile), "true" or "false"; empty:
    unset, the default (compiled on GPUs)."""
    steps: int = 8
    environment_replicas: int = 1
    """Our legs: the arithmetic environment's `replicas` (under `grpojob run`, that many server processes)."""
    learning_rate: float = 1e-6
    colocated_generation_memory: float = 0.35
    lora_rank: int = 0
    """`spec.training.lora` of this rank (alpha twice the rank, every linear projection), and TRL's
    `peft_config` the same; 0 trains every weight."""
    sleep_while_training: str = ""
    """Our colocated leg: `spec.generation.sleepWhileTraining` (``true``/``false``; empty: the job's default,
    sleeping for a full fine-tune and not for LoRA)."""
    trl_use_vllm: bool = True
    """False: TRL generates with transformers (how the leg is smoke-tested on a CPU)."""
    verl_gpu_memory_utilization: float = 0.6
    """verl's leg: `rollout.gpu_memory_utilization`. verl's tuning guide recommends 0.5-0.7 and its GRPO examples
    use 0.6; it frees the engine's KV cache while training (`free_cache_engine`), so the share is not taken
    from training memory as a vLLM that stays awake takes it."""
    verl_max_token_len_per_gpu: int = 0
    """verl's leg: `actor.ppo_max_token_len_per_gpu` (dynamic batch size: a micro-batch is that many tokens);
    0: ``micro_batch_size`` sequences at the longest prompt and completion, our micro-batch's token budget."""
    breakdown_backend: str = "vllm"
    """``transformers``: the breakdown leg on a CPU, without the raw replay (its smoke test)."""


def model_dir(out: Path, workload: Workload) -> Path:
    """The model directory, written by a child process on first use: a process whose CPU thread pools ran
    (writing 1.5B random weights) must not fork vLLM's engine."""
    path = out / f"model-{workload.shape}"
    if not (path / "config.json").exists():
        command = [sys.executable, "-m", "grpojob_trainer.cli", "tiny-model", str(path), "--shape", workload.shape]
        subprocess.run(command, check=True)
    return path


def dataset_path(out: Path, workload: Workload) -> Path:
    """The arithmetic rows of the GRPO legs (two steps' worth to spare), written on first use."""
    path = out / "arithmetic.jsonl"
    if not path.exists():
        from grpojob_trainer.environments.dataset import write_rows

        write_rows("arithmetic", workload.prompts_per_step * (workload.steps + 2), path, 0)
    return path


def random_messages(tokenizer: Any, count: int, prompt_tokens: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """``count`` user messages of random printable text whose chat prompt is ``prompt_tokens`` tokens."""
    rng = random.Random(seed)
    overhead = len(chat_prompt(tokenizer, [{"role": "user", "content": ""}]))
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 "
    return [
        [{"role": "user", "content": "".join(rng.choice(alphabet) for _ in range(prompt_tokens - overhead))}]
        for _ in range(count)
    ]


def chat_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    from grpojob_trainer.generation.chat import build_prompt_token_ids

    return build_prompt_token_ids(tokenizer, messages, None, add_generation_prompt=True)


# --------------------------------------------------------------------------------------------------
# generation legs


def leg_generation_raw(out: Path, workload: Workload) -> dict[str, Any]:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    model = model_dir(out, workload)
    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    prompts = [chat_prompt(tokenizer, m) for m in random_messages(tokenizer, workload.prompts, workload.prompt_tokens)]
    llm = LLM(
        model=str(model),
        max_model_len=workload.prompt_tokens + workload.new_tokens + 8,
        gpu_memory_utilization=workload.gpu_memory_utilization,
        dtype="bfloat16",
        seed=0,
        logprobs_mode="processed_logprobs",
        enable_prefix_caching=True,
    )
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=workload.new_tokens, logprobs=0, detokenize=False)
    llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], params, use_tqdm=False)  # warm-up
    started = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - started
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {
        "seconds": seconds,
        "generated_tokens": generated,
        "tokens_per_s": generated / seconds,
        "scheduler": scheduler_limits(llm.llm_engine),
    }


def scheduler_limits(engine: Any) -> dict[str, int] | None:
    """The engine's batch limits: the two legs must run with the same ones to compare their throughput."""
    scheduler = getattr(getattr(engine, "vllm_config", None), "scheduler_config", None)
    if scheduler is None:
        return None
    return {"max_num_seqs": scheduler.max_num_seqs, "max_num_batched_tokens": scheduler.max_num_batched_tokens}


def leg_generation_http(out: Path, workload: Workload) -> dict[str, Any]:
    from grpojob_trainer.generation.app import ServerConfig
    from grpojob_trainer.generation.backend import SamplingParams
    from grpojob_trainer.generation.server import GenerationServer
    from grpojob_trainer.generation.vllm_backend import VLLMBackend

    model = model_dir(out, workload)
    backend = VLLMBackend(
        model,
        max_model_len=workload.prompt_tokens + workload.new_tokens + 8,
        gpu_memory_utilization=workload.gpu_memory_utilization,
    )
    messages = random_messages(backend.tokenizer, workload.prompts, workload.prompt_tokens)
    config = ServerConfig("bench", SamplingParams(1.0, 1.0, workload.new_tokens))

    # The requests come from another process, as they do from the environment servers: an HTTP client
    # in the server's process would compete with it and with the engine's output handling for the GIL.
    with GenerationServer(backend, config) as server, multiprocessing.get_context("spawn").Pool(1) as client:
        client.apply(send_chat_requests, (server.base_url, messages[:1], workload.new_tokens))  # warm-up
        seconds, answers = client.apply(send_chat_requests, (server.base_url, messages, workload.new_tokens))
    prompt_lengths = {a["usage"]["prompt_tokens"] for a in answers}
    generated = sum(a["usage"]["completion_tokens"] for a in answers)
    limits = scheduler_limits(backend.async_llm)
    backend.shutdown()
    return {
        "seconds": seconds,
        "generated_tokens": generated,
        "tokens_per_s": generated / seconds,
        "prompt_tokens": sorted(prompt_lengths),
        "scheduler": limits,
    }


def send_chat_requests(
    base_url: str, conversations: list[list[dict[str, str]]], max_tokens: int
) -> tuple[float, list[dict[str, Any]]]:
    """Send every conversation to ``/chat/completions`` at once (aiohttp, as the environment servers);
    (seconds until the last answer, answers)."""
    import aiohttp

    async def send_all() -> list[dict[str, Any]]:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as client:

            async def one(messages: list[dict[str, str]]) -> dict[str, Any]:
                body = {"model": "bench", "messages": messages, "temperature": 1.0, "top_p": 1.0}
                async with client.post(f"{base_url}/chat/completions", json=body | {"max_tokens": max_tokens}) as r:
                    r.raise_for_status()
                    return await r.json()

            return await asyncio.gather(*(one(m) for m in conversations))

    started = time.perf_counter()
    answers = asyncio.run(send_all())
    return time.perf_counter() - started, answers


# --------------------------------------------------------------------------------------------------
# GRPO legs


def job_yaml(out: Path, workload: Workload, name: str, colocated: bool, ahead: int = 0) -> Path:
    model = model_dir(out, workload)
    data = dataset_path(out, workload)
    job = {
        "apiVersion": "grpo.dev/v1alpha1",
        "kind": "GRPOJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"path": str(model), "servedModelName": "policy"},
            "dataset": {"path": str(data)},
            "environments": [
                {
                    "name": "arithmetic",
                    "command": ["python", "-m", "grpojob_trainer.environments", "arithmetic"],
                    "replicas": workload.environment_replicas,
                }
            ],
            "generation": {
                "backend": "vllm",
                "gpusPerReplica": 1,
                "gpuMemoryUtilization": workload.colocated_generation_memory if colocated else 0.85,
                "maxModelLen": workload.max_new_tokens + 256,
                "maxNewTokens": workload.max_new_tokens,
                **(
                    {"sleepWhileTraining": workload.sleep_while_training.lower() == "true"}
                    if workload.sleep_while_training
                    else {}
                ),
            },
            "training": {
                "gpusPerReplica": 1,
                "microBatchSize": workload.micro_batch_size,
                **({"torchCompile": workload.torch_compile.lower() == "true"} if workload.torch_compile else {}),
                "optimizer": {"learningRate": workload.learning_rate},
                **(
                    {"lora": {"rank": workload.lora_rank, "alpha": 2 * workload.lora_rank}}
                    if workload.lora_rank
                    else {}
                ),
            },
            "grpo": {
                "promptsPerStep": workload.prompts_per_step,
                "generationsPerPrompt": workload.generations_per_prompt,
                "maxSteps": workload.steps,
                "rolloutConcurrency": workload.prompts_per_step * workload.generations_per_prompt,
                "maxOffPolicySteps": ahead,
            },
            "checkpointing": {"path": str(out / f"{name}-checkpoints"), "interval": 1000},
            # A LoRA leg exports its adapter: merging the 7B base at the end is not the step being measured.
            **({"output": {"format": "adapter"}} if workload.lora_rank else {}),
        },
    }
    path = out / f"{name}.yaml"
    path.write_text(json.dumps(job, indent=2))
    return path


def median_after_warmup(rows: list[dict[str, float]], key: str) -> float:
    values = [r[key] for r in rows[1:] if key in r]
    return statistics.median(values) if values else float("nan")


def parameter_count(model: Path) -> int:
    """Parameters stored in the model directory (a tied output layer is stored, and counted, once)."""
    from safetensors import safe_open

    total = 0
    for file in model.glob("*.safetensors"):
        with safe_open(file, "pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open is not iterable)
                count = 1
                for size in handle.get_slice(key).get_shape():
                    count *= size
                total += count
    return total


def training_flops_per_token(model: Path, mean_sequence: float, frozen_base: bool = False) -> float:
    """Forward + backward FLOPs per token: 6 per parameter (the tied output layer counted once, as the
    matmul it is) plus causal attention, 6 · layers · hidden · mean sequence length. A frozen base (LoRA)
    gets no weight gradients: 4 per parameter, its forward and the gradients of its inputs (the adapter's
    own few percent are left out)."""
    config = json.loads((model / "config.json").read_text())
    per_parameter = 4 if frozen_base else 6
    attention = 6 * config["num_hidden_layers"] * config["hidden_size"] * mean_sequence
    return per_parameter * parameter_count(model) + attention


def clear_previous_run(out: Path, name: str) -> Path:
    """Remove an earlier run of the leg ``name`` (its output and checkpoints) and return its run directory:
    `grpojob run` resumes from the checkpoint it finds, so a leg run twice would otherwise train no step and
    report the first run's metrics."""
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(out / f"{name}-checkpoints", ignore_errors=True)
    return run_dir


def leg_grpo_ours(out: Path, workload: Workload, gpus: int = 1, ahead: int = 0) -> dict[str, Any]:
    name = "ours-colocated" if gpus == 1 else "ours-2gpu" if ahead == 0 else f"ours-2gpu-async{ahead}"
    job = job_yaml(out, workload, name, colocated=gpus == 1, ahead=ahead)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(gpus))).split(",")
    if len(visible) < gpus:
        raise SystemExit(f"this leg needs {gpus} GPUs; CUDA_VISIBLE_DEVICES={','.join(visible)}")
    env = os.environ | {"CUDA_VISIBLE_DEVICES": ",".join(visible[:gpus])}
    run_dir = clear_previous_run(out, name)
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpojob_trainer.cli",
            "run",
            str(job),
            "--out",
            str(run_dir),
            "--no-progress",
            "--no-tensorboard",
        ],
        check=True,
        env=env,
    )
    wall = time.perf_counter() - started
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    sequences = workload.prompts_per_step * workload.generations_per_prompt
    mean_sequence = median_after_warmup(rows, "tokens") / sequences
    flops = training_flops_per_token(model_dir(out, workload), mean_sequence, frozen_base=bool(workload.lora_rank))
    train_tps = median_after_warmup(rows, "train_tokens_per_s")
    return {
        "wall_seconds": wall,
        "steps": len(rows),
        "step_seconds": median_after_warmup(rows, "time/step"),
        "generation_seconds": median_after_warmup(rows, "time/generation"),
        "prepare_seconds": median_after_warmup(rows, "time/prepare"),
        "training_seconds": median_after_warmup(rows, "time/training"),
        "weight_sync_seconds": median_after_warmup(rows, "time/weight_sync"),
        "weight_sync_seconds_each": [r.get("time/weight_sync") for r in rows],
        "engine_sleep_seconds": median_after_warmup(rows, "weight_sync/sleep_seconds"),
        "free_gib_while_training": median_after_warmup(rows, "weight_sync/free_gib_while_training"),
        "rollout_wait_seconds": median_after_warmup(rows, "time/rollout_wait"),
        "rollout_seconds_p50": median_after_warmup(rows, "rollout/seconds/median"),
        "rollout_seconds_p90": median_after_warmup(rows, "rollout/seconds/p90"),
        "rollout_tail_seconds": median_after_warmup(rows, "rollout/tail_s"),
        "generated_tokens_per_s": median_after_warmup(rows, "throughput/generated_tokens_per_s"),
        "train_tokens_per_s": train_tps,
        "tokens_per_step": median_after_warmup(rows, "tokens"),
        "reward_first": rows[0].get("rollout/reward/mean"),
        "reward_last": rows[-1].get("rollout/reward/mean"),
        "training_mfu": train_tps * flops / (BF16_PEAK_TFLOPS * 1e12),
    }


def leg_grpo_trl(out: Path, workload: Workload) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpojob_trainer.environments.arithmetic import score_answer

    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"})
    os.environ.setdefault("MASTER_PORT", "29517")
    model = model_dir(out, workload)
    rows = [json.loads(line) for line in dataset_path(out, workload).open()]
    dataset = Dataset.from_list(
        [
            {
                "prompt": [{"role": m["role"], "content": m["content"]} for m in r["responses_create_params"]["input"]],
                "expected_answer": r["expected_answer"],
            }
            for r in rows
        ]
    )

    def reward(completions: list[Any], expected_answer: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [sum(score_answer(t, e).values()) for t, e in zip(texts, expected_answer, strict=True)]

    step_times: list[float] = []
    phase_times: list[dict[str, float]] = []
    current: dict[str, float] = {}

    def synchronize() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    class StepTimes(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            synchronize()
            current.clear()
            self.started = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            synchronize()
            step_times.append(time.perf_counter() - self.started)
            phase_times.append(dict(current))

    def timed(name: str, method: Any) -> Any:
        """``method`` adding its seconds to the current step's ``name``."""

        def call(*args: Any, **kwargs: Any) -> Any:
            synchronize()
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                synchronize()
                current[name] = current.get(name, 0.0) + time.perf_counter() - started

        return call

    sequences = workload.prompts_per_step * workload.generations_per_prompt
    accumulation = sequences // workload.micro_batch_size
    config = GRPOConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=workload.micro_batch_size,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation,  # one optimizer step per batch of generations, as ours
        num_generations=workload.generations_per_prompt,
        max_completion_length=workload.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        learning_rate=workload.learning_rate,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        max_steps=workload.steps,
        bf16=torch.cuda.is_available(),
        gradient_checkpointing=False,  # TRL's default is on; ours recomputes only the micro-batches that would not fit
        use_cpu=not torch.cuda.is_available(),
        use_vllm=workload.trl_use_vllm,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=workload.colocated_generation_memory,
        vllm_max_model_length=workload.max_new_tokens + 256,
        model_init_kwargs={"dtype": "float32"},
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
    )
    peft_config = None
    if workload.lora_rank:  # as ours: every linear projection, alpha twice the rank, the base frozen in bf16
        from peft import LoraConfig

        rank = workload.lora_rank
        peft_config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", task_type="CAUSAL_LM")
        config.model_init_kwargs = {"dtype": "bfloat16" if torch.cuda.is_available() else "float32"}
    trainer = GRPOTrainer(
        model=str(model),
        reward_funcs=[reward],
        args=config,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(model, local_files_only=True),
        callbacks=[StepTimes()],
        peft_config=peft_config,
    )
    # TRL's generation phase: sampling (vLLM, weight sync included), rewards, advantages and, with the
    # importance-sampling correction, the old policy's log-probabilities; once per optimizer step here.
    trainer._generate_and_score_completions = timed("generation", trainer._generate_and_score_completions)
    trainer._generate_single_turn = timed("sampling", trainer._generate_single_turn)
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    import trl

    generation = [p.get("generation", 0.0) for p in phase_times]
    sampling = [p.get("sampling", 0.0) for p in phase_times]
    lengths = [row["completions/mean_length"] for row in trainer.state.log_history if "completions/mean_length" in row]
    sequences_per_step = workload.prompts_per_step * workload.generations_per_prompt

    def median_after_first(values: list[float]) -> float:
        return statistics.median(values[1:]) if len(values) > 1 else float("nan")

    return {
        "wall_seconds": wall,
        "steps": len(step_times),
        "step_seconds": median_after_first(step_times),
        "generation_seconds": median_after_first(generation),
        "sampling_seconds": median_after_first(sampling),
        "training_seconds": median_after_first([t - g for t, g in zip(step_times, generation, strict=True)]),
        "generated_tokens_per_step": median_after_first([m * sequences_per_step for m in lengths]),
        "sampling_tokens_per_s": median_after_first(
            [m * sequences_per_step / s for m, s in zip(lengths, sampling, strict=False) if s > 0]
        ),
        "step_seconds_each": step_times,
        "generation_seconds_each": generation,
        "trl_version": trl.__version__,
    }


# --------------------------------------------------------------------------------------------------
# verl: its GRPO trainer with the hybrid engine (FSDP actor and vLLM rollout on the same GPU)

VERL_PROMPT_TOKENS = 256
"""verl's `data.max_prompt_length`: the other GRPO legs' engines hold ``max_new_tokens + 256`` tokens."""

VERL_REWARD_HEADER = '''"""The arithmetic environment's reward (grpojob_trainer.environments.arithmetic's
`score_answer`) as verl's custom reward function. Written by benchmarks/gpu_grpo.py; standalone, so that verl's
reward workers load it by path."""

'''

VERL_REWARD_FUNCTION = '''

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **_):
    """verl's reward: the completion's text (special tokens dropped) against the row's expected digits."""
    parts = score_answer(solution_str, str(ground_truth))
    return {"score": sum(parts.values()), **parts}
'''


def verl_reward_source() -> str:
    """The reward file's text: our `score_answer` and its weights, as they are, and verl's ``compute_score``
    around it (verl calls it with the decoded completion and the row's ``reward_model.ground_truth``)."""
    import inspect

    from grpojob_trainer.environments import arithmetic

    weights = "".join(
        f"{name} = {getattr(arithmetic, name)!r}\n" for name in ("DIGITS_WEIGHT", "CONTAINS_WEIGHT", "EXACT_WEIGHT")
    )
    return VERL_REWARD_HEADER + weights + "\n\n" + inspect.getsource(arithmetic.score_answer) + VERL_REWARD_FUNCTION


def verl_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our arithmetic rows (`dataset_path`) as verl's RL dataset reads them from parquet: the chat ``prompt``,
    ``data_source``, and the expected answer as ``reward_model.ground_truth``."""
    return [
        {
            "data_source": "arithmetic",
            "prompt": [{"role": m["role"], "content": m["content"]} for m in row["responses_create_params"]["input"]],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": str(row["expected_answer"])},
            "extra_info": {"index": index},
        }
        for index, row in enumerate(rows)
    ]


def verl_token_budget(workload: Workload) -> int:
    """`actor.ppo_max_token_len_per_gpu`: ``verl_max_token_len_per_gpu``, else our micro-batch at full length."""
    return workload.verl_max_token_len_per_gpu or workload.micro_batch_size * (
        VERL_PROMPT_TOKENS + workload.max_new_tokens
    )


def verl_settings(workload: Workload) -> dict[str, Any]:
    """verl's speed settings the leg uses, by their config names (in the leg's result and the table)."""
    tokens = verl_token_budget(workload)
    return {
        "actor_rollout_ref.model.use_remove_padding": True,
        "actor_rollout_ref.actor.use_dynamic_bsz": True,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": tokens,
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": 2 * tokens,
        "actor_rollout_ref.rollout.gpu_memory_utilization": workload.verl_gpu_memory_utilization,
        "actor_rollout_ref.actor.strategy": "fsdp2",
        "actor_rollout_ref.rollout.free_cache_engine": True,
        "actor_rollout_ref.rollout.enforce_eager": False,
    }


def verl_overrides(workload: Workload, model: Path, train_file: Path, reward_file: Path, run_dir: Path) -> list[str]:
    """The Hydra overrides of ``python -m verl.trainer.main_ppo`` for ``workload``: the other GRPO legs' model,
    rows, group size, completion length, learning rate, micro-batch (as a token budget) and optimizer (AdamW
    without weight decay, gradients clipped at 1), one optimizer step per batch of generations, clip 0.2/0.28,
    no KL, token-mean loss, truncated importance sampling at 2 (our `importanceSamplingCap`)."""
    overrides = [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=2.0",
        f"data.train_files={train_file}",
        f"data.val_files={train_file}",
        f"data.train_batch_size={workload.prompts_per_step}",
        f"data.max_prompt_length={VERL_PROMPT_TOKENS}",
        f"data.max_response_length={workload.max_new_tokens}",
        "data.shuffle=False",
        f"actor_rollout_ref.model.path={model}",
        # flash-attn (verl's default attention) has no wheel on PyPI: transformers' sdpa, see verl_notes
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",  # as the TRL leg; see verl_notes
        f"actor_rollout_ref.actor.optim.lr={workload.learning_rate}",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "actor_rollout_ref.actor.optim.clip_grad=1.0",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={workload.prompts_per_step}",
        "actor_rollout_ref.actor.ppo_epochs=1",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={workload.micro_batch_size}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.n={workload.generations_per_prompt}",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.top_p=1.0",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
        f"reward.custom_reward_function.path={reward_file}",
        "reward.custom_reward_function.name=compute_score",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.total_epochs=1",
        f"trainer.total_training_steps={workload.steps}",
        "trainer.logger=[console,file]",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.project_name=grpojob-bench",
        "trainer.experiment_name=grpo-verl",
        f"trainer.default_local_dir={run_dir / 'checkpoints'}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={run_dir / 'metrics.jsonl'}",
    ]
    overrides += [f"{key}={value}" for key, value in verl_settings(workload).items()]
    if workload.lora_rank:  # as ours and TRL's: every linear projection, alpha twice the rank
        overrides += [
            f"actor_rollout_ref.model.lora_rank={workload.lora_rank}",
            f"actor_rollout_ref.model.lora_alpha={2 * workload.lora_rank}",
            "actor_rollout_ref.model.target_modules=all-linear",
            "actor_rollout_ref.rollout.load_format=safetensors",  # verl's LoRA guide: vLLM loads the base itself
        ]
    return overrides


def verl_notes(workload: Workload) -> list[str]:
    """What of the workload verl's leg does not match, and why (the table prints them)."""
    notes = [
        "attention: transformers' sdpa, not verl's default flash_attention_2: the flash-attn package is on PyPI "
        "only as source (a CUDA build) and the GPU machine has no network; with use_remove_padding transformers "
        "masks the packed sequences block-diagonally for sdpa, where flash-attn runs a variable-length kernel",
        "versions: verl 0.9.1 declares transformers>=5.5.3,<5.11 and its vllm extra vLLM 0.24.0; it runs here "
        "with transformers 5.17.0 and vLLM 0.26.0 (its code gates on vLLM >= 0.18 only), installed without "
        "dependency resolution",
        f"micro-batch: dynamic batch size packs micro-batches by tokens, not sequences: "
        f"{verl_token_budget(workload)} tokens per training micro-batch ({workload.micro_batch_size} sequences of "
        f"the longest prompt and completion, {VERL_PROMPT_TOKENS} + {workload.max_new_tokens}), twice that per "
        "log-probability micro-batch (verl's guide: forward-only budgets can be larger)",
        "gradient checkpointing off, as in the TRL leg (verl's examples turn it on to fit larger micro-batches)",
        "verl's fused output-head kernels (use_fused_kernels) and Liger kernels off, their defaults "
        "(liger-kernel is not carried)",
        "old-policy log-probabilities recomputed by the actor before the update (verl's default, not bypass "
        "mode), with token-level importance sampling against vLLM's at a cap of 2, as ours",
    ]
    if workload.verl_gpu_memory_utilization != workload.colocated_generation_memory:
        notes.append(
            f"vLLM memory share {workload.verl_gpu_memory_utilization} (verl's recommendation), ours and TRL's "
            f"{workload.colocated_generation_memory}: verl frees the engine's KV cache while training"
        )
    if workload.lora_rank:
        notes.append(
            "LoRA: verl keeps the base in float32 (fsdp_config.model_dtype fp32, its default; bf16 compute by mixed "
            "precision), ours and TRL's hold the frozen base in bf16; bf16 there would make the adapter and its "
            "optimizer state bf16 too. The adapter goes to vLLM as an adapter (lora.merge false, verl's default)"
        )
    return notes


def verl_result(steps: list[dict[str, Any]], workload: Workload, model: Path) -> dict[str, Any]:
    """The leg's result from verl's per-step metrics (its file logger's ``data``), keyed as the TRL leg's:
    ``timing_s/step``, ``timing_s/gen`` (generation), ``timing_s/update_actor`` (training) and the rest."""
    sequences = workload.prompts_per_step * workload.generations_per_prompt
    tokens = median_after_warmup(steps, "perf/total_num_tokens")
    update = median_after_warmup(steps, "timing_s/update_actor")
    generation = median_after_warmup(steps, "timing_s/gen")
    generated = median_after_warmup(steps, "response_length/mean") * sequences
    train_tps = tokens / update
    flops = training_flops_per_token(model, tokens / sequences, frozen_base=bool(workload.lora_rank))
    allocated = [s["perf/max_memory_allocated_gb"] for s in steps if "perf/max_memory_allocated_gb" in s]
    return {
        "steps": len(steps),
        "step_seconds": median_after_warmup(steps, "timing_s/step"),
        "generation_seconds": generation,
        "training_seconds": update,
        "old_log_prob_seconds": median_after_warmup(steps, "timing_s/old_log_prob"),
        "reward_seconds": median_after_warmup(steps, "timing_s/reward"),
        "advantage_seconds": median_after_warmup(steps, "timing_s/adv"),
        "weight_sync_seconds": median_after_warmup(steps, "timing_s/update_weights"),
        "generated_tokens_per_step": generated,
        "generated_tokens_per_s": generated / generation,
        "tokens_per_step": tokens,
        "train_tokens_per_s": train_tps,
        "training_mfu": train_tps * flops / (BF16_PEAK_TFLOPS * 1e12),
        "verl_actor_mfu": median_after_warmup(steps, "perf/mfu/actor"),
        "actor_max_allocated_gib": max(allocated) if allocated else None,
        "reward_first": steps[0].get("critic/score/mean") if steps else None,
        "reward_last": steps[-1].get("critic/score/mean") if steps else None,
        "step_seconds_each": [s.get("timing_s/step") for s in steps],
        "generation_seconds_each": [s.get("timing_s/gen") for s in steps],
    }


def compose_verl_config(overrides: list[str]) -> Any:
    """verl's config for ``overrides``, composed from its ``ppo_trainer`` config and validated as its entry point
    validates it (`validate_config`, the actor's config dataclass); the CPU test's check of `verl_overrides`."""
    from hydra import compose, initialize_config_dir
    from verl.trainer import main_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    with initialize_config_dir(config_dir=str(Path(main_ppo.__file__).parent / "config"), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    return config


def leg_grpo_verl(out: Path, workload: Workload) -> dict[str, Any]:
    import importlib.metadata

    import pyarrow as pa
    import pyarrow.parquet as pq

    out = out.resolve()  # verl runs in the run directory: every path it is given is absolute
    model = model_dir(out, workload)
    rows = [json.loads(line) for line in dataset_path(out, workload).open()]
    run_dir = clear_previous_run(out, "verl")
    run_dir.mkdir(parents=True)
    train_file, reward_file = run_dir / "arithmetic.parquet", run_dir / "arithmetic_reward.py"
    pq.write_table(pa.Table.from_pylist(verl_rows(rows)), train_file)
    reward_file.write_text(verl_reward_source())
    metrics = run_dir / "metrics.jsonl"
    overrides = verl_overrides(workload, model, train_file, reward_file, run_dir)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")
    env = os.environ | {"CUDA_VISIBLE_DEVICES": visible[0], "VERL_FILE_LOGGER_PATH": str(metrics)}
    started = time.perf_counter()
    # verl's own entry point in a process of its own (it starts Ray; its workers and vLLM go with it)
    command = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides, f"hydra.run.dir={run_dir / 'hydra'}"]
    subprocess.run(command, check=True, env=env, cwd=run_dir)
    wall = time.perf_counter() - started
    steps = [json.loads(line)["data"] for line in metrics.read_text().splitlines() if line.strip()]
    return verl_result(steps, workload, model) | {
        "wall_seconds": wall,
        "verl_version": importlib.metadata.version("verl"),
        "settings": verl_settings(workload),
        "notes": verl_notes(workload),
        "overrides": overrides,
    }


# --------------------------------------------------------------------------------------------------
# generation breakdown: the GRPO step's generation phase against raw vLLM on the same lengths


@dataclass(frozen=True)
class EngineRecord:
    """One request as the generation server saw it (``time.perf_counter``: the same clock in every process
    of the machine, CLOCK_MONOTONIC)."""

    arrived: float
    finished: float
    prompt_token_ids: tuple[int, ...]
    generated: int


def record_requests(engine: Any, records: list[EngineRecord]) -> None:
    """Wrap the server's ``engine.generate`` (`DirectEngine` or `BatchingEngine`) to append an `EngineRecord`
    per request to ``records``."""
    generate = engine.generate

    async def timed(request: Any, params: Any = None) -> Any:
        arrived = time.perf_counter()
        result = await generate(request, params)
        records.append(EngineRecord(arrived, time.perf_counter(), request.prompt_token_ids, len(result.token_ids)))
        return result

    engine.generate = timed


def drive_rollout_step(
    environment_urls: dict[str, str], rows: list[dict[str, Any]], generations: int, sampling: tuple[float, float, int]
) -> dict[str, Any]:
    """One step's rollouts as the driver collects them (run in a process of its own): every row
    ``generations`` times, all in flight at once. Returns the step's start and end on the machine's clock and
    each successful rollout's (sent, finished) seconds after the batch began."""
    from grpojob_trainer.experience.rollouts import PolicySampling, collect_rollouts
    from grpojob_trainer.nemo_gym.protocol import Row
    from grpojob_trainer.training.loop import expand_groups

    expanded, groups = expand_groups([Row.model_validate(r) for r in rows], generations)
    began = time.perf_counter()
    batch = asyncio.run(
        collect_rollouts(
            expanded,
            environment_urls,
            concurrency=len(expanded),
            group_indices=groups,
            sampling=PolicySampling(*sampling),
        )
    )
    ended = time.perf_counter()
    return {
        "began": began,
        "ended": ended,
        "spans": [(o.started_s, o.finished_s) for o in batch.outcomes if o.ok],
        "failed": len(batch.failures),
        "errors": [o.error for o in batch.failures[:3]],
        "generated": sum(s.generated_tokens for s in batch.samples),
    }


def latency_summary(values: list[float]) -> dict[str, float]:
    """sum, p50, p90 and max of per-request seconds."""
    from grpojob_trainer.experience.metrics import percentile

    return {
        "sum": sum(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "max": max(values),
    }


def step_breakdown(driver: dict[str, Any], engine: list[EngineRecord]) -> dict[str, Any]:
    """Where one step's generation phase went: the driver's view (`drive_rollout_step`) against the
    generation server's (`record_requests`), both on the machine's clock."""
    from grpojob_trainer.experience.metrics import percentile

    if not engine or not driver["spans"]:
        raise ValueError(f"no completed requests to break down (rollout errors: {driver.get('errors')})")
    wall = driver["ended"] - driver["began"]
    first_in = min(r.arrived for r in engine)
    last_out = max(r.finished for r in engine)
    generated = sum(r.generated for r in engine)
    engine_seconds = [r.finished - r.arrived for r in engine]
    rollout_seconds = [finished - sent for sent, finished in driver["spans"]]
    finished = [end for _, end in driver["spans"]]
    engine_finished = [r.finished for r in engine]
    return {
        "wall_s": wall,
        "engine_window_s": last_out - first_in,
        "head_s": first_in - driver["began"],
        "end_s": driver["ended"] - last_out,
        "arrival_spread_s": max(r.arrived for r in engine) - first_in,
        "requests": len(engine),
        "rollouts": len(rollout_seconds),
        "failed_rollouts": driver["failed"],
        "prompt_tokens": sum(len(r.prompt_token_ids) for r in engine),
        "generated_tokens": generated,
        "tokens_per_s": generated / wall,
        "engine_tokens_per_s": generated / (last_out - first_in),
        "engine_request_s": latency_summary(engine_seconds),
        "driver_rollout_s": latency_summary(rollout_seconds),
        "hops_p50_s": percentile(rollout_seconds, 50) - percentile(engine_seconds, 50),
        "tail_s": max(finished) - percentile(finished, 90),
        "engine_tail_s": max(engine_finished) - percentile(engine_finished, 90),
    }


def replay_step(engine: list[EngineRecord]) -> list[dict[str, Any]]:
    """The step's requests in arrival order: prompt token ids and how many tokens each generated."""
    return [
        {"prompt": list(r.prompt_token_ids), "generated": r.generated} for r in sorted(engine, key=lambda r: r.arrived)
    ]


def medians(steps: list[dict[str, Any]], skip_first: bool = True) -> dict[str, float]:
    """The median of every numeric field (nested ones as ``outer.inner``) over the steps after the first."""
    rows = steps[1:] if skip_first and len(steps) > 1 else steps
    flat: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            items = value.items() if isinstance(value, dict) else [(None, value)]
            for inner, number in items:
                if isinstance(number, int | float) and not isinstance(number, bool):
                    flat.setdefault(key if inner is None else f"{key}.{inner}", []).append(float(number))
    return {key: statistics.median(values) for key, values in flat.items()}


def breakdown_engine_settings(workload: Workload) -> dict[str, Any]:
    """The colocated job's engine (`grpojob run` with ``job_yaml(colocated=True)``), for both legs."""
    return {
        "max_model_len": workload.max_new_tokens + 256,
        "gpu_memory_utilization": workload.colocated_generation_memory,
        "dtype": "bfloat16",
        "seed": 0,
    }


def leg_generation_breakdown(out: Path, workload: Workload) -> dict[str, Any]:
    from grpojob_api import v1alpha1 as api
    from grpojob_trainer.generation.app import ServerConfig, create_app
    from grpojob_trainer.generation.backend import GenerationBackend, SamplingParams
    from grpojob_trainer.local.environment_processes import EnvironmentProcesses
    from grpojob_trainer.net.http import ThreadedServer

    model = model_dir(out, workload)
    rows = [json.loads(line) for line in dataset_path(out, workload).open()]
    engine_settings = breakdown_engine_settings(workload)
    backend: GenerationBackend
    if workload.breakdown_backend == "vllm":
        from grpojob_trainer.generation.vllm_backend import VLLMBackend

        backend = VLLMBackend(model, **engine_settings)

        def drop_prefix_cache() -> None:  # as every weight load does in the job
            backend._run(backend.async_llm.reset_prefix_cache())
    else:
        from grpojob_trainer.generation.transformers_backend import TransformersBackend

        backend = TransformersBackend(model, max_model_len=engine_settings["max_model_len"], device="cpu")

        def drop_prefix_cache() -> None:
            pass

    app = create_app(backend, ServerConfig("policy", SamplingParams(1.0, 1.0, workload.max_new_tokens)))
    records: list[EngineRecord] = []
    record_requests(app.state.engine, records)
    environment = api.EnvironmentSpec.model_validate(
        {
            "name": "arithmetic",
            "command": ["python", "-m", "grpojob_trainer.environments", "arithmetic"],
            "replicas": workload.environment_replicas,
        }
    )
    steps: list[dict[str, Any]] = []
    replay: list[list[dict[str, Any]]] = []
    with (
        ThreadedServer(app) as server,
        EnvironmentProcesses(
            [environment],
            policy_base_urls=[f"{server.url}/v1"],
            policy_model_name="policy",
            gcs_address="unused",
            log_dir=out / "breakdown-environments",
        ) as environment_urls,
        multiprocessing.get_context("spawn").Pool(1) as driver,
    ):
        for step in range(workload.steps):
            drop_prefix_cache()
            records.clear()
            batch = rows[step * workload.prompts_per_step : (step + 1) * workload.prompts_per_step]
            sampling = (1.0, 1.0, workload.max_new_tokens)
            result = driver.apply(
                drive_rollout_step, (environment_urls, batch, workload.generations_per_prompt, sampling)
            )
            steps.append(step_breakdown(result, list(records)))
            replay.append(replay_step(list(records)))
            print(f"step {step + 1}: " + json.dumps({k: v for k, v in steps[-1].items() if not isinstance(v, dict)}))
    limits = scheduler_limits(getattr(backend, "engine", None))
    if workload.breakdown_backend == "vllm":
        backend.shutdown()
    result: dict[str, Any] = {"steps": steps, "median": medians(steps), "scheduler": limits}
    if workload.breakdown_backend != "vllm":
        return result
    replay_file = out / "generation-breakdown-replay.json"
    replay_file.write_text(json.dumps({"model": str(model), "engine": engine_settings, "steps": replay}))
    # The raw engine in a fresh process: this one's engine is gone and its memory with it.
    replayed = subprocess.run([sys.executable, __file__, "generation-replay", "--out", str(out)])
    if replayed.returncode != 0:  # keep what was measured; the replay's log says why
        return result | {"raw_error": f"generation-replay exited {replayed.returncode}"}
    raw = json.loads((out / "generation-replay.json").read_text())
    result["raw"] = {key: raw[key] for key in ("median", "scheduler")}
    ours, floor = result["median"], raw["median"]
    result["in_step_over_raw_tokens_per_s"] = ours["tokens_per_s"] / floor["tokens_per_s"]
    result["engine_window_over_raw_tokens_per_s"] = ours["engine_tokens_per_s"] / floor["tokens_per_s"]
    return result


def leg_generation_replay(out: Path, workload: Workload) -> dict[str, Any]:
    """Replay ``generation-breakdown-replay.json`` on vLLM's offline engine: every step's prompts with their
    exact output lengths, prefill only and in full, the prefix cache dropped before each."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = json.loads((out / "generation-breakdown-replay.json").read_text())
    llm = LLM(
        model=spec["model"],
        **spec["engine"],
        logprobs_mode="processed_logprobs",
        enable_prefix_caching=True,
    )

    def exactly(tokens: int) -> SamplingParams:
        return SamplingParams(
            temperature=1.0,
            top_p=1.0,
            max_tokens=tokens,
            min_tokens=tokens,
            ignore_eos=True,
            logprobs=0,
            detokenize=False,
        )

    def run(prompts: list[Any], params: list[Any]) -> tuple[float, int]:
        llm.reset_prefix_cache()
        started = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - started, sum(len(o.outputs[0].token_ids) for o in outputs)

    first = spec["steps"][0][0]
    run([TokensPrompt(prompt_token_ids=first["prompt"])], [exactly(first["generated"])])  # warm-up
    steps = []
    for requests in spec["steps"]:
        prompts = [TokensPrompt(prompt_token_ids=r["prompt"]) for r in requests]
        prefill_s, _ = run(prompts, [exactly(1) for _ in requests])
        seconds, generated = run(prompts, [exactly(r["generated"]) for r in requests])
        steps.append(
            {
                "wall_s": seconds,
                "prefill_only_s": prefill_s,
                "generated_tokens": generated,
                "step_generated_tokens": sum(r["generated"] for r in requests),  # equal, unless vLLM stopped early
                "tokens_per_s": generated / seconds,
            }
        )
    return {"steps": steps, "median": medians(steps), "scheduler": scheduler_limits(llm.llm_engine)}


# --------------------------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    found = {}
    for name in ("torch", "vllm", "transformers", "trl", "verl", "ray"):
        try:
            module = __import__(name)
            found[name] = getattr(module, "__version__", "?")
        except Exception:  # a leg's package absent: not part of this run
            continue
    try:
        import torch

        found["gpu"] = torch.cuda.get_device_name(0)
    except Exception:
        pass
    return found


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "n/a"


def table(out: Path) -> str:
    """The Markdown table of the legs found under ``out``."""
    legs = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json") if p.stem in LEGS}
    raw, http = legs.get("generation-raw", {}), legs.get("generation-http", {})
    ours, trl, two = legs.get("grpo-ours", {}), legs.get("grpo-trl", {}), legs.get("grpo-ours-2gpu", {})
    verl = legs.get("grpo-verl", {})
    two_async = legs.get("grpo-ours-2gpu-async", {})

    def fmt(value: Any, digits: int = 3) -> str:
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value if value is not None else "n/a")

    lines = [
        "| measurement | ours | anchor | ours / anchor |",
        "|---|---|---|---|",
        f"| generation tokens/s (HTTP server vs raw vLLM `LLM.generate`) | {fmt(http.get('tokens_per_s'), 0)} "
        f"| {fmt(raw.get('tokens_per_s'), 0)} | {ratio(http.get('tokens_per_s'), raw.get('tokens_per_s'))} |",
        f"| step: generation / prepare / training / weight sync s | {fmt(ours.get('generation_seconds'))} / "
        f"{fmt(ours.get('prepare_seconds'))} / {fmt(ours.get('training_seconds'))} / "
        f"{fmt(ours.get('weight_sync_seconds'))} | | |",
        f"| generated tokens/s in the GRPO step | {fmt(ours.get('generated_tokens_per_s'), 0)} | | |",
        f"| training tokens/s, MFU (bf16 peak {BF16_PEAK_TFLOPS:.0f} TFLOP/s) | "
        f"{fmt(ours.get('train_tokens_per_s'), 0)}, "
        f"{fmt(ours.get('training_mfu'))} | | |",
        f"| weight sync ms, same GPU (CUDA IPC) | {fmt((ours.get('weight_sync_seconds') or 0) * 1000, 1)} | | |",
    ]
    breakdown = legs.get("generation-breakdown", {})
    if breakdown.get("median"):
        b, floor = breakdown["median"], breakdown.get("raw", {}).get("median", {})
        lines += [
            f"| generation phase outside training: wall / engine window / head / end / tail s | "
            f"{fmt(b.get('wall_s'))} / {fmt(b.get('engine_window_s'))} / {fmt(b.get('head_s'))} / "
            f"{fmt(b.get('end_s'))} / {fmt(b.get('tail_s'))} | raw replay {fmt(floor.get('wall_s'))} "
            f"(prefill only {fmt(floor.get('prefill_only_s'))}) | {ratio(b.get('wall_s'), floor.get('wall_s'))} |",
            f"| per request p50 / p90 s: at the generation server; per rollout at the driver | "
            f"{fmt(b.get('engine_request_s.p50'))} / {fmt(b.get('engine_request_s.p90'))}; "
            f"{fmt(b.get('driver_rollout_s.p50'))} / {fmt(b.get('driver_rollout_s.p90'))} | | |",
            f"| generated tokens/s: phase, engine window vs raw replay of the same lengths | "
            f"{fmt(b.get('tokens_per_s'), 0)}, {fmt(b.get('engine_tokens_per_s'), 0)} | "
            f"{fmt(floor.get('tokens_per_s'), 0)} | {ratio(b.get('tokens_per_s'), floor.get('tokens_per_s'))} |",
        ]
    if two:
        lines += [
            f"| 2 GPUs (policy / engine): step s, weight sync ms (NCCL) | {fmt(two.get('step_seconds'))}, "
            f"{fmt((two.get('weight_sync_seconds') or 0) * 1000, 1)} | | |",
        ]
    if two and two_async:
        lines += [
            f"| 2 GPUs, asynchronous (maxOffPolicySteps 1) vs synchronous: step s (waiting for rollouts s) | "
            f"{fmt(two_async.get('step_seconds'))} ({fmt(two_async.get('rollout_wait_seconds'))}) | "
            f"{fmt(two.get('step_seconds'))} ({fmt(two.get('rollout_wait_seconds'))}) | "
            f"{ratio(two_async.get('step_seconds'), two.get('step_seconds'))} |",
        ]
    lines += grpo_peers_table(trl, verl, ours, fmt)
    lines.append("")
    lines.append("Versions: " + json.dumps(next((v["versions"] for v in legs.values() if "versions" in v), {})))
    return "\n".join(lines)


def grpo_peers_table(trl: dict[str, Any], verl: dict[str, Any], ours: dict[str, Any], fmt: Any) -> list[str]:
    """The GRPO step of TRL, verl and ours side by side (lower is faster, smaller is less memory), then how each
    peer's phases are counted and the verl leg's settings and what it could not match."""
    if not (trl or verl or ours):
        return []
    lines = [
        "",
        "| GRPO step, median of the steps after the first | TRL | verl | ours | ours / TRL | ours / verl |",
        "|---|---|---|---|---|---|",
    ]
    for label, key in (
        ("step s", "step_seconds"),
        ("generation phase s", "generation_seconds"),
        ("training phase s", "training_seconds"),
        ("peak GPU memory GiB (nvidia-smi, every process)", "peak_gpu_gib"),
        (f"training MFU (bf16 peak {BF16_PEAK_TFLOPS:.0f} TFLOP/s)", "training_mfu"),
    ):
        peer_trl, peer_verl, our = trl.get(key), verl.get(key), ours.get(key)
        lines.append(
            f"| {label} | {fmt(peer_trl)} | {fmt(peer_verl)} | {fmt(our)} | {ratio(our, peer_trl)} "
            f"| {ratio(our, peer_verl)} |"
        )
    lines += [
        "",
        "Phases: TRL's generation is generation and scoring (its vLLM sampling "
        f"{fmt(trl.get('sampling_seconds'))} s of it), its training the rest of the step; verl's are "
        "`timing_s/gen` and `timing_s/update_actor`, its step also holding the old-policy log-probabilities "
        f"({fmt(verl.get('old_log_prob_seconds'))} s) and the weight sync ({fmt(verl.get('weight_sync_seconds'))} s).",
    ]
    if verl.get("settings"):
        named = ", ".join(f"`{key.rsplit('.', 1)[-1]}` {value}" for key, value in verl["settings"].items())
        lines += ["", f"verl {verl.get('verl_version', '')}: {named}."]
    if verl.get("notes"):
        lines += ["", "Where the verl leg differs from the others, and why:"]
        lines += [f"- {note}" for note in verl["notes"]]
    return lines


class GpuMemoryPeak:
    """The most memory in use on any visible GPU while the block runs, every 0.5 s from ``nvidia-smi`` (it
    counts every process: the engine's and the policy's); None without ``nvidia-smi``."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s, self.peak_gib = interval_s, None
        self._stop = threading.Event()

    def _sample(self) -> None:
        query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
        while not self._stop.wait(self.interval_s):
            try:
                used = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout.split()
            except (OSError, subprocess.TimeoutExpired):
                return
            if used:
                peak = max(int(mib) for mib in used) / 1024
                self.peak_gib = max(self.peak_gib or 0.0, peak)

    def __enter__(self) -> GpuMemoryPeak:
        if shutil.which("nvidia-smi"):
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()


LEGS = {
    "generation-raw": leg_generation_raw,
    "generation-http": leg_generation_http,
    "grpo-ours": leg_grpo_ours,
    "grpo-ours-2gpu": lambda out, workload: leg_grpo_ours(out, workload, gpus=2),
    "grpo-ours-2gpu-async": lambda out, workload: leg_grpo_ours(out, workload, gpus=2, ahead=1),
    "grpo-trl": leg_grpo_trl,
    "grpo-verl": leg_grpo_verl,
    "generation-breakdown": leg_generation_breakdown,
    "generation-replay": leg_generation_replay,
}


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["prompts=8", "trl_use_vllm=false"]`` → typed `Workload` fields."""
    fields = {f.name: f.type for f in dataclasses.fields(Workload)}
    out: dict[str, Any] = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in fields:
            raise SystemExit(f"--set {item}: Workload has no field {name!r}")
        kind = fields[name]
        if kind == "bool":
            out[name] = value.lower() in ("1", "true", "yes")
        elif kind in ("int", "float"):
            out[name] = {"int": int, "float": float}[kind](value)
        else:
            out[name] = value
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("leg", choices=[*LEGS, "all", "table", "prepare"])
    parser.add_argument("--out", type=Path, default=Path("runs/bench-gpu"))
    parser.add_argument("--steps", type=int, default=Workload.steps)
    parser.add_argument("--label", default="", help="results in LEG-LABEL.json (a leg run twice with other --set)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="override a Workload field (repeatable)"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    workload = Workload(steps=args.steps, **parse_overrides(args.set))
    if args.leg == "table":
        print(table(args.out))
        return 0
    if args.leg == "prepare":  # the model and rows, before legs run side by side on several GPUs
        print(model_dir(args.out, workload), dataset_path(args.out, workload))
        return 0
    if args.leg == "all":
        failed = []
        for leg in ("generation-raw", "generation-http", "grpo-ours", "grpo-trl", "grpo-verl"):
            command = [sys.executable, __file__, leg, "--out", str(args.out), "--steps", str(args.steps)]
            command += [f"--set={item}" for item in args.set]
            if subprocess.run(command).returncode != 0:
                failed.append(leg)
        print(table(args.out))
        return 1 if failed else 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    with GpuMemoryPeak() as memory:
        result = LEGS[args.leg](args.out, workload)
    result |= {"peak_gpu_gib": memory.peak_gib, "workload": asdict(workload), "versions": versions()}
    name = f"{args.leg}-{args.label}" if args.label else args.leg
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
