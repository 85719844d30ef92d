"""CUDA self-check of the packed forward with torch's varlen_attn against the padded forward.

Run on the GPU before measuring (a random Qwen2-shaped model, nothing downloaded; about a minute):

    PYTHONPATH=api:operator:trainer:testing python benchmarks/varlen_check.py

Checks, each printed with its figures and PASS or FAIL (exit status 1 if any fails):
  kernel     `packing._flash` (varlen_attn) against SDPA on each sequence, bf16, forward and gradients
  used       the packed forward really calls varlen_attn (its op appears in the profiler's events)
  fp32       packed vs padded forward in float32 (the exact SDPA-per-sequence path on CUDA)
  bf16       packed (varlen_attn) vs padded under bf16 autocast, tied and untied embeddings: log-probs and
             gradients, judged against the padded forward's own bf16 error (bf16 padded vs fp32 padded)
  trainer    the PolicyLearner chooses the packed forward here (CUDA, bf16, varlen_attn present)
"""

from __future__ import annotations

import sys

import torch

from grpojob_trainer.algorithm.samples import TrainingSample
from grpojob_trainer.policy import packing
from grpojob_trainer.policy.forward import TokenBatch, build_batch, token_logprobs

VOCAB = 4096
TEMPERATURE = 0.9
failures: list[str] = []


def report(name: str, ok: bool, **figures: float | str) -> None:
    shown = ", ".join(
        f"{key} {value:.3g}" if isinstance(value, float) else f"{key} {value}" for key, value in figures.items()
    )
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {shown}", flush=True)
    if not ok:
        failures.append(name)


def random_model(tied: bool) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,  # GQA, as Qwen2.5-1.5B (12 and 2)
        intermediate_size=1024,
        tie_word_embeddings=tied,
        attn_implementation="sdpa",
    )
    return transformers.AutoModelForCausalLM.from_config(config).cuda().eval()


def micro_batch(count: int = 16, seed: int = 0) -> TokenBatch:
    """``count`` sequences of 8-300 tokens (one of each extreme), prompts of a fifth."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [8, 300, *torch.randint(8, 301, (count - 2,), generator=generator).tolist()]
    samples = []
    for index, n in enumerate(lengths):
        prompt = max(1, n // 5)
        samples.append(
            TrainingSample(
                token_ids=tuple(torch.randint(1, VOCAB, (n,), generator=generator).tolist()),
                generated_mask=(False,) * prompt + (True,) * (n - prompt),
                generation_log_probs=(0.0,) * n,
                reward=float(index % 2),
                group_index=index // 4,
            )
        )
    return build_batch(samples, pad_token_id=0).to(torch.device("cuda"))


def logprobs_and_grads(
    model: torch.nn.Module, batch: TokenBatch, packed: bool, bf16: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities on the loss mask and the flattened gradient of a weighted sum of them."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        values = token_logprobs(model, batch, TEMPERATURE, packed=packed)
    weights = torch.linspace(-1.0, 1.0, values.numel(), device=values.device).view_as(values)
    (values * weights)[batch.loss_mask].sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return values[batch.loss_mask].detach(), grads


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def check_kernel() -> None:
    generator = torch.Generator(device="cuda").manual_seed(1)
    lengths = [5, 300, 17, 128, 1, 64]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    n, heads, kv_heads, dim = sum(lengths), 12, 2, 128
    q = torch.randn(n, heads, dim, device="cuda", generator=generator, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(n, kv_heads, dim, device="cuda", generator=generator, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(n, kv_heads, dim, device="cuda", generator=generator, dtype=torch.bfloat16, requires_grad=True)
    out_grad = torch.randn(n, heads, dim, device="cuda", generator=generator, dtype=torch.bfloat16)
    results = []
    for attend in (
        lambda: packing._flash(q, k, v, cu, max(lengths), dim**-0.5),
        lambda: packing._per_sequence(q.float(), k.float(), v.float(), cu, dim**-0.5),
    ):
        for t in (q, k, v):
            t.grad = None
        out = attend()
        out.backward(out_grad.to(out.dtype))
        results.append((out.float(), [t.grad.float() for t in (q, k, v)]))
    (flash, flash_grads), (reference, reference_grads) = results
    out_diff = float((flash - reference).abs().max())
    grad_rel = max(relative(a, b) for a, b in zip(flash_grads, reference_grads, strict=True))
    report(
        "kernel",
        out_diff < 0.05 and grad_rel < 0.02,
        out_max_abs_diff=out_diff,
        grad_max_rel_diff=grad_rel,
        parameters=",".join(sorted(packing._kernel_parameters() & {"is_causal", "window_size", "scale", "enable_gqa"})),
    )


def check_used() -> None:
    model, batch = random_model(tied=True), micro_batch(4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        logprobs_and_grads(model, batch, packed=True, bf16=True)
    names = sorted({event.name for event in profile.events() if "varlen" in event.name.lower()})
    report("used", bool(names), ops=";".join(names) or "none")


def check_forwards() -> None:
    batch = micro_batch()
    for tied in (True, False):
        model = random_model(tied)
        exact, exact_grads = logprobs_and_grads(model, batch, packed=False, bf16=False)
        packed32, packed32_grads = logprobs_and_grads(model, batch, packed=True, bf16=False)
        diff32, rel32 = float((packed32 - exact).abs().max()), relative(packed32_grads, exact_grads)
        report(f"fp32 tied={tied}", diff32 < 1e-3 and rel32 < 1e-3, logprob_max_abs_diff=diff32, grad_rel_diff=rel32)
        padded, padded_grads = logprobs_and_grads(model, batch, packed=False, bf16=True)
        packed, packed_grads = logprobs_and_grads(model, batch, packed=True, bf16=True)
        bf16_error = float((padded - exact).abs().max())
        bf16_grad_error = relative(padded_grads, exact_grads)
        diff, rel = float((packed - padded).abs().max()), relative(packed_grads, padded_grads)
        diff_exact, rel_exact = float((packed - exact).abs().max()), relative(packed_grads, exact_grads)
        report(
            f"bf16 tied={tied}",
            diff_exact <= max(0.05, 2 * bf16_error) and rel_exact <= max(0.05, 2 * bf16_grad_error),
            packed_vs_padded_logprob_max_abs=diff,
            packed_vs_padded_grad_rel=rel,
            packed_vs_fp32_logprob_max_abs=diff_exact,
            padded_vs_fp32_logprob_max_abs=bf16_error,
            packed_vs_fp32_grad_rel=rel_exact,
            padded_vs_fp32_grad_rel=bf16_grad_error,
        )


def check_trainer() -> None:
    from grpojob_api.v1alpha1 import AdvantageSpec, OptimizerSpec
    from grpojob_trainer.algorithm.grpo import LossConfig
    from grpojob_trainer.policy.learner import PolicyLearner

    trainer = PolicyLearner(
        random_model(tied=True),
        optimizer=OptimizerSpec(learningRate=1e-5),
        loss=LossConfig(),
        advantage=AdvantageSpec(),
        micro_batch_size=16,
        temperature=TEMPERATURE,
        pad_token_id=0,
        precision="bf16",
    )
    report("trainer", trainer.packed, packed=str(trainer.packed))


def main() -> int:
    if not torch.cuda.is_available():
        print("FAIL  needs a CUDA GPU", file=sys.stderr)
        return 1
    if packing.varlen_kernel() is None:
        print(f"FAIL  torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn (torch 2.10+)")
        return 1
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name()}")
    for check in (check_kernel, check_used, check_forwards, check_trainer):
        try:
            check()
        except Exception as error:  # a check that crashes is a failure with its message, the others still run
            report(check.__name__.removeprefix("check_"), False, error=f"{type(error).__name__}: {error}"[:500])
    print("FAIL: " + ", ".join(failures) if failures else "PASS: all checks")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
