"""Batches of samples as tensors, and the forwards that give their tokens' log-probabilities under the policy.

Alignment. A sample's tokens ``x_0 … x_{L-1}`` are right-padded into ``input_ids [B, L]``. The model's
logits at position ``t`` predict token ``t + 1``, so every per-token tensor here is over *targets*:
``[B, L - 1]``, where position ``t`` holds ``log p(x_{t+1} | x_0 … x_t)``, the loss mask is
``generated_mask[1:]`` and the generation engine's log-probabilities are ``generation_log_probs[1:]``.
(The first token has no prefix and is never trained; it is always part of a prompt.)

Packing. On a GPU with bf16 and torch's variable-length flash kernel (``varlen_attn``, torch 2.10+), the
forwards run on each micro-batch's sequences packed into one row with attention per sequence
(`grpojob_trainer.policy.packing`): no padding token is computed and logits exist only where a real token is
predicted; the log-probabilities are scattered back into the ``[B, L - 1]`` grid, so the loss, the masks
and the metrics are the same either way. Elsewhere (the CPU, float32, an older torch) the forwards run
on the right-padded ``[B, L]`` batch. On the H200 at the GRPO benchmark's lengths packing is 1.3x faster
at 32 sequences per micro-batch and 1.5x at 64, and about even at 16, where launching the kernels from the
CPU takes longer than running them (`benchmarks/packing.py`, docs/benchmarks.md).

Logits. The log-probabilities come from the chunked head of `grpojob_trainer.policy.logprobs`: a
micro-batch's float32 logits over the vocabulary never exist at once (at 8 sequences of 600 tokens over
152k tokens they alone were 2.9 GB, with as much again for the softmax and its gradient). Models whose
logits are more than the output embedding's product (soft-capped or scaled) are log-softmaxed from their
materialised logits instead.

Temperature. Rollouts are sampled from ``softmax(logits / temperature)``, so the trainer computes its
log-probabilities from logits divided by the same temperature: this is the distribution the samples
came from, and the one the generation engine's ``generation_log_probs`` must describe (for vLLM:
``logprobs_mode="processed_logprobs"``). Top-p truncation is not applied to the trainer's
log-probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from grpojob_trainer.algorithm.samples import TrainingSample
from grpojob_trainer.policy.logprobs import logprob_head, plain_head
from grpojob_trainer.policy.packing import attention_per_sequence, forward_kwargs, pack


@dataclass
class TokenBatch:
    """Right-padded tensors of a list of samples; per-token tensors are over targets (``[B, L - 1]``)."""

    input_ids: torch.Tensor
    """``[B, L]`` long; padding is ``pad_token_id``."""
    attention_mask: torch.Tensor
    """``[B, L]`` long; 1 on real tokens."""
    target_ids: torch.Tensor
    """``[B, L - 1]`` long: ``input_ids[:, 1:]``."""
    loss_mask: torch.Tensor
    """``[B, L - 1]`` bool: the target was generated (false on prompt, tool output and padding)."""
    generation_logprobs: torch.Tensor
    """``[B, L - 1]`` float32: the generation engine's log-probability of each target (0 off the mask)."""
    rewards: torch.Tensor
    """``[B]`` float32."""
    group_ids: torch.Tensor
    """``[B]`` long: the samples' ``group_index``."""

    @property
    def generated_tokens(self) -> int:
        return int(self.loss_mask.sum())

    @property
    def tokens(self) -> int:
        return int(self.attention_mask.sum())

    def to(self, device: torch.device) -> TokenBatch:
        return TokenBatch(**{name: value.to(device) for name, value in vars(self).items()})


def build_batch(samples: Sequence[TrainingSample], pad_token_id: int) -> TokenBatch:
    """Right-pad ``samples`` (at least one, each of at least two tokens) into a `TokenBatch`."""
    if not samples:
        raise ValueError("build_batch needs at least one sample")
    length = max(len(s.token_ids) for s in samples)
    if length < 2:
        raise ValueError("samples need at least two tokens (a prompt token and a generated one)")
    size = len(samples)
    input_ids = torch.full((size, length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((size, length), dtype=torch.long)
    generated = torch.zeros((size, length), dtype=torch.bool)
    gen_logprobs = torch.zeros((size, length), dtype=torch.float32)
    for row, sample in enumerate(samples):
        n = len(sample.token_ids)
        input_ids[row, :n] = torch.tensor(sample.token_ids, dtype=torch.long)
        attention_mask[row, :n] = 1
        generated[row, :n] = torch.tensor(sample.generated_mask, dtype=torch.bool)
        gen_logprobs[row, :n] = torch.tensor(sample.generation_log_probs, dtype=torch.float32)
    return TokenBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        target_ids=input_ids[:, 1:],
        loss_mask=generated[:, 1:],
        generation_logprobs=gen_logprobs[:, 1:],
        rewards=torch.tensor([s.reward for s in samples], dtype=torch.float32),
        group_ids=torch.tensor([s.group_index for s in samples], dtype=torch.long),
    )


def padding_batch(sample: TrainingSample, pad_token_id: int) -> TokenBatch:
    """A one-sequence batch of ``sample`` with an empty loss mask: a micro-batch that contributes nothing
    (run by a rank whose share of the step has fewer micro-batches than another's)."""
    batch = build_batch([sample], pad_token_id)
    batch.loss_mask = torch.zeros_like(batch.loss_mask)
    return batch


def token_logprobs(
    model: torch.nn.Module, batch: TokenBatch, temperature: float, *, packed: bool = False
) -> torch.Tensor:
    """``[B, L - 1]`` float32 log-probabilities of each target under ``softmax(logits / temperature)``.

    ``packed``: the forward runs on the batch's sequences packed into one row, attention per sequence
    (`grpojob_trainer.policy.packing`), logits only where a real token is predicted; otherwise on the padded
    ``[B, L]`` batch. Same values either way. Gradients flow unless called under ``torch.no_grad()``.
    Padding positions hold meaningless values (0 when packed); mask them with ``batch.loss_mask``.
    """
    if packed:
        return packed_token_logprobs(model, batch, temperature)
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "use_cache": False}
    targets = torch.nn.functional.pad(batch.target_ids, (0, 1))  # the last position predicts no target
    return _target_logprobs(model, inputs, targets, temperature)[:, :-1]


def packed_token_logprobs(model: torch.nn.Module, batch: TokenBatch, temperature: float) -> torch.Tensor:
    """`token_logprobs` through one packed row: no padding token is computed, and the head covers only the
    positions that predict a real token."""
    row = pack(batch.input_ids, batch.attention_mask)
    with attention_per_sequence(model):
        values = _target_logprobs(model, forward_kwargs(row), row.targets[None], temperature)[0]
    grid = torch.zeros(batch.target_ids.shape, dtype=torch.float32, device=values.device)
    return grid.masked_scatter(row.grid, values)


def _target_logprobs(model: torch.nn.Module, inputs: dict, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """The float32 log-probability of each of ``targets`` (shaped as the forward's logits without the
    vocabulary) under ``model(**inputs)``: through the chunked head where the model's head is plain."""
    if plain_head(model):
        with logprob_head(model, targets, temperature):
            return model(**inputs).logits
    logits = model(**inputs).logits.float() / temperature
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
