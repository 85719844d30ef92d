"""The training phase of a GRPO step alone on a GPU: `PolicyLearner.train_step` over a step's samples,
padded against packed (varlen attention), at several micro-batch sizes; train tokens/s and MFU as
`benchmarks/gpu_grpo.py` computes them (no generation engine beside it on the GPU).

Usage (a GPU; the model written by `benchmarks/gpu_grpo.py prepare` or `grpojob tiny-model --shape
qwen2.5-1.5b`):
    python benchmarks/train_phase.py --model /root/bench/model-qwen2.5-1.5b [--micro-batches 16,32]
        [--ways padded,packed] [--steps 4] [--samples 256]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import transformers

from grpojob_api.v1alpha1 import AdvantageSpec, OptimizerSpec
from grpojob_trainer.algorithm.grpo import LossConfig
from grpojob_trainer.algorithm.samples import TrainingSample
from grpojob_trainer.policy.learner import PolicyLearner
from grpojob_trainer.policy.packing import varlen_available

BF16_PEAK_TFLOPS = 790.0
"""As `benchmarks/gpu_grpo.py`: dense bf16 matmul peak measured on the H200."""


def step_samples(count: int, vocab: int, seed: int = 0) -> list[TrainingSample]:
    """A step's samples like the GRPO benchmark's: a ~40-token prompt, 16-256 generated tokens, groups of 8."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for index in range(count):
        prompt, completion = 40, int(torch.randint(16, 257, (1,), generator=generator))
        out.append(
            TrainingSample(
                token_ids=tuple(torch.randint(1, vocab, (prompt + completion,), generator=generator).tolist()),
                generated_mask=(False,) * prompt + (True,) * completion,
                generation_log_probs=(0.0,) * prompt + (-2.0,) * completion,
                reward=float(index % 3 == 0),
                group_index=index // 8,
            )
        )
    return out


def flops_per_token(model: torch.nn.Module, mean_sequence: float) -> float:
    """6 per parameter (a tied output layer once) plus causal attention, as `gpu_grpo.training_flops_per_token`."""
    config = model.config
    parameters = sum(p.numel() for p in model.parameters())
    return 6 * parameters + 6 * config.num_hidden_layers * config.hidden_size * mean_sequence


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--micro-batches", default="16,32", help="sequences per micro-batch, comma-separated")
    parser.add_argument(
        "--ways", default="padded,packed", help="of padded, packed, packed-compile (decoder layers compiled)"
    )
    parser.add_argument("--steps", type=int, default=4, help="measured steps, after one warm-up step")
    parser.add_argument("--samples", type=int, default=256, help="sequences per step")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    if any(w.startswith("packed") for w in args.ways.split(",")) and not varlen_available(torch.device("cuda")):
        parser.error(
            f"packed needs torch.nn.attention.varlen.varlen_attn (torch 2.10+); this is torch {torch.__version__}"
        )
    for micro in [int(m) for m in args.micro_batches.split(",")]:
        for way in args.ways.split(","):
            model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).cuda()
            trainer = PolicyLearner(
                model,
                optimizer=OptimizerSpec(learningRate=1e-6),
                loss=LossConfig(),
                advantage=AdvantageSpec(),
                micro_batch_size=micro,
                temperature=1.0,
                pad_token_id=0,
                precision="bf16",
                packed=way.startswith("packed"),
                compile_layers=way.endswith("-compile"),
            )
            samples = step_samples(args.samples, model.config.vocab_size)
            mean_sequence = sum(len(s.token_ids) for s in samples) / len(samples)
            rows = []
            torch.cuda.reset_peak_memory_stats()
            try:
                for _ in range(args.steps + 1):
                    rows.append(trainer.train_step(samples))
                seconds = statistics.median(r["time/training"] for r in rows[1:])
                tokens_per_s = statistics.median(r["train_tokens_per_s"] for r in rows[1:])
                result = {
                    "training_s": round(seconds, 3),
                    "train_tokens_per_s": round(tokens_per_s),
                    "mfu": round(tokens_per_s * flops_per_token(model, mean_sequence) / (BF16_PEAK_TFLOPS * 1e12), 3),
                    "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
                    "each_step_s": [round(r["time/training"], 3) for r in rows],  # the first warms up (compiles)
                }
            except torch.OutOfMemoryError as error:
                result = {"error": f"OutOfMemoryError: {error}"[:200]}
            print(json.dumps({"micro_batch": micro, "way": way, **result}), flush=True)
            del trainer, model
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
