"""One training micro-batch of the GRPO step, several ways: forward + backward seconds, tokens/s, peak GiB.

    padded       right-padded [B, L] with an attention mask, [B, L, V] float32 logits (the old path)
    padded-head  right-padded, the chunked log-probability head (`grpojob_trainer.policy.logprobs`)
    packed-sdpa  one packed row, block-diagonal causal mask (SDPA), the chunked head
    packed-flex  one packed row, flex attention's block-sparse mask, the chunked head
    packed-full  one packed row (SDPA), [1, N, V] float32 logits
    packed-varlen  what the policy trains with on CUDA: one packed row, attention per sequence through
                 torch's varlen_attn flash kernel, float32 logits of the real targets only
                 (`grpojob_trainer.policy.forward.packed_token_logprobs`; needs torch 2.10 or later)
    WAY-compile  WAY with each decoder layer compiled (torch.compile, dynamic shapes; an experiment)

Usage (a GPU; the model written by `benchmarks/gpu_grpo.py prepare`):
    python benchmarks/packing.py --model /root/bench/model-qwen2.5-1.5b [--sequences 16] [--repeats 5]
        [--ways padded,packed-varlen] [--chunk-mib 1024]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import torch
import transformers

from grpojob_trainer.algorithm.samples import TrainingSample
from grpojob_trainer.policy import logprobs
from grpojob_trainer.policy.forward import TokenBatch, build_batch, packed_token_logprobs
from grpojob_trainer.policy.logprobs import logprob_head
from grpojob_trainer.policy.packing import varlen_available


def lengths(sequences: int, seed: int) -> list[int]:
    """Sequence lengths like the GRPO benchmark's: a ~40-token prompt and up to 256 generated tokens."""
    generator = torch.Generator().manual_seed(seed)
    return [40 + int(torch.randint(16, 257, (1,), generator=generator)) for _ in range(sequences)]


@functools.cache
def varlen_batch(sizes: tuple[int, ...], vocab: int, device: str) -> TokenBatch:
    """A micro-batch of ``sizes`` random sequences (the last 80 % of each generated), built once: the
    trainer builds its batches before the training phase."""
    samples = []
    for n in sizes:
        prompt = n // 5 or 1
        samples.append(
            TrainingSample(
                token_ids=tuple(torch.randint(1, vocab, (n,)).tolist()),
                generated_mask=(False,) * prompt + (True,) * (n - prompt),
                generation_log_probs=(0.0,) * n,
                reward=0.0,
                group_index=0,
            )
        )
    return build_batch(samples, pad_token_id=0).to(torch.device(device))


def run(model: torch.nn.Module, way: str, sizes: list[int], vocab: int) -> float:
    way = way.removesuffix("-compile")
    device = next(model.parameters()).device
    ids = [torch.randint(1, vocab, (n,), device=device) for n in sizes]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        if way == "packed-varlen":
            batch = varlen_batch(tuple(sizes), vocab, str(device))
            loss = packed_token_logprobs(model, batch, 1.0).sum()
        elif way.startswith("padded"):
            length = max(sizes)
            batch = torch.zeros(len(sizes), length, dtype=torch.long, device=device)
            mask = torch.zeros_like(batch)
            for row, seq in enumerate(ids):
                batch[row, : len(seq)] = seq
                mask[row, : len(seq)] = 1
            targets = torch.roll(batch, -1, dims=1)
            if way == "padded":
                logits = model(input_ids=batch, attention_mask=mask, use_cache=False).logits.float()
                values = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
            else:
                with logprob_head(model, targets, 1.0):
                    values = model(input_ids=batch, attention_mask=mask, use_cache=False).logits
            loss = (values * mask).sum()
        else:
            packed = torch.cat(ids)[None]
            positions = torch.cat([torch.arange(n, device=device) for n in sizes])[None]
            targets = torch.roll(packed, -1, dims=1)
            if way == "packed-full":
                logits = model(input_ids=packed, position_ids=positions, use_cache=False).logits.float()
                loss = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).sum()
            else:
                with logprob_head(model, targets, 1.0):
                    loss = model(input_ids=packed, position_ids=positions, use_cache=False).logits.sum()
    loss.backward()
    return float(loss.detach())


def print_profile(model: torch.nn.Module, way: str, sizes: list[int], vocab: int) -> None:
    """One more forward + backward under the profiler: the CUDA time by operation."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        run(model, way, sizes, vocab)
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    print(f"--- {way}: CUDA time by operation")
    print(profile.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=60), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--ways",
        default="padded,packed-varlen",
        help="of padded, padded-head, packed-sdpa, packed-flex, packed-full, packed-varlen; a -compile suffix "
        "compiles each decoder layer (torch.compile, dynamic shapes) first",
    )
    parser.add_argument("--chunk-mib", type=int, help="the head's float32 logits per chunk (logprobs.CHUNK_BYTES)")
    parser.add_argument(
        "--kept-softmax-gib",
        type=float,
        help="the head keeps the softmax for the backward pass up to this size, recomputes it above "
        "(logprobs.KEPT_PROBABILITIES_BYTES)",
    )
    parser.add_argument("--profile", action="store_true", help="also print each way's 20 costliest CUDA operations")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    if any(w.startswith("packed-varlen") for w in args.ways.split(",")) and not varlen_available(torch.device("cuda")):
        parser.error(
            f"packed-varlen needs torch.nn.attention.varlen.varlen_attn (torch 2.10 or later); this is torch "
            f"{torch.__version__}"
        )
    if args.kept_softmax_gib is not None:
        logprobs.KEPT_PROBABILITIES_BYTES = int(args.kept_softmax_gib * 2**30)
    if args.chunk_mib:
        logprobs.CHUNK_BYTES = args.chunk_mib << 20
    sizes = lengths(args.sequences, 0)
    results = {"sequences": args.sequences, "tokens": sum(sizes), "padded_tokens": len(sizes) * max(sizes)}
    for way in args.ways.split(","):
        attention = "flex_attention" if way == "packed-flex" else "sdpa"
        model = transformers.AutoModelForCausalLM.from_pretrained(
            args.model, torch_dtype=torch.float32, attn_implementation=attention
        ).cuda()
        model.gradient_checkpointing_disable()
        if way.endswith("-compile"):
            for layer in model.model.layers:
                layer.compile(dynamic=True)
        vocab = model.config.vocab_size
        times = []
        try:
            for repeat in range(args.repeats + 1):
                torch.cuda.synchronize()
                started = time.perf_counter()
                run(model, way, sizes, vocab)
                model.zero_grad(set_to_none=True)
                torch.cuda.synchronize()
                if repeat:  # the first is warm-up (and compilation for flex)
                    times.append(time.perf_counter() - started)
            seconds = statistics.median(times)
            results[way] = {
                "seconds": seconds,
                "tokens_per_s": sum(sizes) / seconds,
                "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
            }
            if args.profile:
                print_profile(model, way, sizes, vocab)
        except Exception as error:  # a way that does not run here is reported, not fatal
            results[way] = {"error": f"{type(error).__name__}: {error}"[:300]}
        print(json.dumps({way: results[way]}), flush=True)
        del model
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
