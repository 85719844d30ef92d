"""Policy training: an HF causal LM, AdamW and one GRPO optimizer step per call of `PolicyLearner.train_step`.

Old policy and mini-batches. With one mini-batch (``grpo.miniBatches: 1``) a step takes one optimizer
step over all its micro-batches, so every forward of the step runs with the weights that generated the
rollouts (the "old" policy of the clipped loss): the old-policy log-probabilities are the training
forward's own, detached, and no separate pass recomputes them (it cost a tenth of a 1.5B step on the
H200). The PPO ratio is 1 in value and its gradient that of the log-probability; the engine's
log-probabilities still enter through the importance-sampling weight. With ``k`` mini-batches the step's
samples are split into ``k`` contiguous parts trained one after another, one optimizer step each; the old
log-probabilities of every sample are computed once, without gradients, before the first update, so
from the second part on the ratio moves and the clip takes effect. Advantages are always those of the
whole step. The model is kept in eval mode (dropout off), so that forward is the policy the engine
sampled from.

Devices and precision. Batches go to the device of the model's parameters. On a GPU with ``precision``
``bf16`` (the default there), forward and backward run under bfloat16 autocast while the weights, their
gradients and AdamW's state stay float32 (the "master weights"); log-probabilities are always computed
from float32 logits. On the CPU everything is float32.

Ranks. The policy may be several processes (`grpojob_trainer.policy.ranks`: one per GPU, gloo ranks on the
CPU), each holding a `PolicyLearner` built with the group's device mesh; the model (and the reference) is
then sharded with FSDP2 before the optimizer is built over the shards. Every rank receives all the
step's samples, computes the step's advantages and loss normaliser (generated tokens or sequences of
the WHOLE step) itself, and trains on its contiguous slice. FSDP2 gathers each layer's weights in every
forward and backward, so all ranks run the same number of micro-batches: a rank with a smaller slice
runs padding micro-batches whose loss mask is empty (no contribution). The ranks' gradients are summed
(each loss is already divided by the step-wide count), clipped by their global norm, and the metrics
combined over ranks. One rank is the same code path with nothing sharded and no process group.

"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grpojob_api.v1alpha1 import AdvantageSpec, GRPOJobSpec, LossAggregation, OptimizerSpec
from grpojob_trainer.algorithm.grpo import (
    LossConfig,
    LossInputs,
    group_advantages,
    policy_loss_statistics,
    tensors_to_floats,
)
from grpojob_trainer.algorithm.samples import TrainingSample
from grpojob_trainer.observability.metrics import PREPARE, TRAINING, StepTimer, tokens_per_second
from grpojob_trainer.policy import memory
from grpojob_trainer.policy.compilation import compiles_layers
from grpojob_trainer.policy.forward import TokenBatch, build_batch, padding_batch, token_logprobs
from grpojob_trainer.policy.lora import adapter_dropout, is_lora
from grpojob_trainer.policy.packing import (
    supports_packing,
    varlen_available,
)
from grpojob_trainer.policy.ranks import (
    all_reduce,
    decoder_layers,
    full_tensor,
    micro_batches_per_rank,
    rank_bounds,
    shard_model,
)

log = logging.getLogger(__name__)


def step_normalizer(samples: Sequence[TrainingSample], aggregation: LossAggregation) -> float:
    """The denominator of the whole step's loss: its trained (generated, after the first) tokens for
    ``token`` aggregation, its sequences for ``sequence``."""
    if aggregation is LossAggregation.TOKEN:
        return float(sum(sum(s.generated_mask[1:]) for s in samples))
    return float(len(samples))


@dataclass
class PreparedBatch:
    """A micro-batch with what its loss needs besides the weights being updated."""

    batch: TokenBatch
    advantages: torch.Tensor
    """``[B]``."""
    ref_logprobs: torch.Tensor | None
    """``[B, L - 1]``, the reference policy's (no gradient), with a KL penalty."""
    old_logprobs: torch.Tensor | None = None
    """``[B, L - 1]``, the policy's before the step's first update (no gradient), with several
    mini-batches; None: the training forward's own, detached."""


class PolicyLearner:
    """Holds the policy (an HF causal LM), its AdamW optimizer and, with a KL penalty, a frozen reference.

    One `train_step` is one GRPO step: advantages from the step's rewards, with a KL penalty the
    reference's log-probabilities (without gradients), then gradients accumulated over micro-batches of
    ``micro_batch_size`` sequences, clipped to ``max_grad_norm``, and one optimizer step.

    The reference policy, when ``loss.kl_coef > 0`` and none is given, is a frozen copy of ``model`` as
    it is at construction: when resuming, construct the trainer from the initial model and load the
    checkpoint afterwards, so that the reference stays the initial policy. A LoRA policy
    (`grpojob_trainer.policy.lora`) needs no copy: its reference is its own base, the adapter disabled.
    Its adapter's dropout, if any, acts in the training forward only.

    ``packed``: forwards on packed rows with attention per sequence (see the module's docstring); None
    chooses them where they pay (CUDA, bf16, torch's ``varlen_attn``). ``compile_layers``: whether each decoder
    layer (the policy's and the reference's) goes through ``torch.compile`` with dynamic shapes
    (``spec.training.torchCompile``, resolved by `compiles_layers`: None compiles on a GPU, never on the CPU).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        optimizer: OptimizerSpec,
        loss: LossConfig,
        advantage: AdvantageSpec,
        micro_batch_size: int,
        temperature: float,
        pad_token_id: int,
        reference_model: torch.nn.Module | None = None,
        precision: str = "fp32",
        mesh: Any = None,
        mini_batches: int = 1,
        packed: bool | None = None,
        compile_layers: bool | None = None,
        checkpointing: bool | None = None,
    ) -> None:
        if precision not in ("bf16", "fp32"):
            raise ValueError(f"precision must be bf16 or fp32, got {precision!r}")
        if temperature <= 0:
            raise ValueError(
                f"temperature must be positive, got {temperature}: GRPO trains on sampled rollouts, and greedy "
                "decoding has no sampling distribution to compute log-probabilities of"
            )
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be at least 1, got {micro_batch_size}")
        if mini_batches < 1:
            raise ValueError(f"mini_batches must be at least 1, got {mini_batches}")
        self.mini_batches = mini_batches
        self.mesh = mesh
        self.rank = 0 if mesh is None else mesh.get_local_rank()
        self.world = 1 if mesh is None else mesh.size()
        self.model = model.eval()
        self.loss_config = loss
        self.advantage = advantage
        self.micro_batch_size = micro_batch_size
        self.temperature = temperature
        self.pad_token_id = pad_token_id
        self.max_grad_norm = optimizer.max_grad_norm
        on_gpu = self.device.type == "cuda"
        self.autocast_dtype = torch.bfloat16 if on_gpu and precision == "bf16" else None
        if packed is None:  # packing pays with a variable-length attention kernel, which needs 16-bit floats
            packed = varlen_available(self.device) and self.autocast_dtype is not None and supports_packing(model)
        self.packed = packed
        """Whether forwards run on packed rows (`packed_token_logprobs`) rather than padded batches."""
        self.checkpointing = checkpointing
        """Whether the layers that can (`gradient_checkpointing_enable`) recompute their activations in the
        backward pass: always, never, or (None) for the micro-batches whose activations would not fit."""
        self.shape = memory.ModelShape.from_config(model.config, sum(p.numel() for p in model.parameters()))
        self._told_recompute = False
        log.info("policy forwards: %s", "packed, variable-length attention" if packed else "right-padded")
        self.lora = is_lora(model)
        self.reference_model: torch.nn.Module | None = None
        if loss.kl_coef > 0 and not self.lora:
            self.reference_model = reference_model if reference_model is not None else copy.deepcopy(model)
            self.reference_model.eval().requires_grad_(False)
        if self.world > 1:  # shard first: the optimizer holds the shards
            shard_model(self.model, mesh)
            if self.reference_model is not None:
                shard_model(self.reference_model, mesh)
        self.compiled = compiles_layers(compile_layers, self.device)
        """Whether the decoder layers run through ``torch.compile``."""
        if self.compiled:
            for module in (self.model, self.reference_model):
                for layer in decoder_layers(module) if module is not None else ():
                    layer.compile(dynamic=True)
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=optimizer.learning_rate,
            betas=(optimizer.beta1, optimizer.beta2),
            weight_decay=optimizer.weight_decay,
            fused=on_gpu or None,
        )

    @classmethod
    def from_spec(
        cls,
        model: torch.nn.Module,
        spec: GRPOJobSpec,
        *,
        pad_token_id: int,
        reference_model: torch.nn.Module | None = None,
        mesh: Any = None,
    ) -> PolicyLearner:
        """A trainer configured by a GRPOJob's spec (optimizer, micro-batch size, loss, advantages, temperature);
        with ``mesh`` (of several ranks), one rank of the sharded policy."""
        return cls(
            model,
            optimizer=spec.training.optimizer,
            loss=LossConfig.from_spec(spec.grpo),
            advantage=spec.grpo.advantage,
            micro_batch_size=spec.training.micro_batch_size,
            temperature=spec.generation.temperature,
            pad_token_id=pad_token_id,
            reference_model=reference_model,
            precision=spec.training.precision,
            mesh=mesh,
            mini_batches=spec.grpo.mini_batches,
            compile_layers=spec.training.torch_compile,
            checkpointing=spec.training.gradient_checkpointing,
        )

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @contextlib.contextmanager
    def _autocast(self) -> Iterator[None]:
        if self.autocast_dtype is None:
            yield
        else:
            with torch.autocast(self.device.type, dtype=self.autocast_dtype):
                yield

    # ----------------------------------------------------------------------------------------------
    # the phases of a step

    def micro_batches(self, samples: Sequence[TrainingSample]) -> list[TokenBatch]:
        """The step's samples in order, in batches of at most ``micro_batch_size``, on the model's device."""
        size = self.micro_batch_size
        return [
            build_batch(samples[start : start + size], self.pad_token_id).to(self.device)
            for start in range(0, len(samples), size)
        ]

    def step_advantages(self, samples: Sequence[TrainingSample]) -> torch.Tensor:
        """``[len(samples)]`` group-relative advantages of the whole step (on the CPU)."""
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        group_ids = torch.tensor([s.group_index for s in samples], dtype=torch.long)
        return group_advantages(
            rewards,
            group_ids,
            normalize_std=self.advantage.normalize_std,
            leave_one_out=self.advantage.leave_one_out,
        )

    def rank_micro_batches(
        self, samples: Sequence[TrainingSample], advantages: torch.Tensor
    ) -> tuple[list[TokenBatch], torch.Tensor]:
        """This rank's micro-batches of ``samples`` (its contiguous slice, then padding micro-batches up to
        the count of the largest slice) and the advantages of each of their rows (``advantages`` holds
        one per sample; 0 on padding)."""
        start, stop = rank_bounds(len(samples), self.rank, self.world)
        batches = self.micro_batches(samples[start:stop])
        advantages = [advantages[start:stop]]
        for _ in range(micro_batches_per_rank(len(samples), self.world, self.micro_batch_size) - len(batches)):
            batches.append(padding_batch(samples[0], self.pad_token_id).to(self.device))
            advantages.append(torch.zeros(1))
        return batches, torch.cat(advantages).to(self.device)

    @torch.no_grad()
    def prepare(
        self,
        samples: Sequence[TrainingSample],
        advantages: torch.Tensor | None = None,
        *,
        old_logprobs: bool = False,
    ) -> list[PreparedBatch]:
        """This rank's micro-batches (see `rank_micro_batches`) with their advantages (by default those of
        ``samples`` as a whole step), with a KL penalty the reference policy's log-probabilities and, with
        ``old_logprobs``, the current policy's."""
        if advantages is None:
            advantages = self.step_advantages(samples)
        batches, advantages = self.rank_micro_batches(samples, advantages)
        prepared = []
        start = 0
        for batch in batches:
            size = batch.input_ids.shape[0]
            ref = old = None
            with self._autocast():
                if self.reference_model is not None:
                    ref = token_logprobs(self.reference_model, batch, self.temperature, packed=self.packed)
                elif self.lora and self.loss_config.kl_coef > 0:
                    with self.model.disable_adapter():  # the base: the LoRA policy's reference
                        ref = token_logprobs(self.model, batch, self.temperature, packed=self.packed)
                if old_logprobs:
                    old = token_logprobs(self.model, batch, self.temperature, packed=self.packed)
            prepared.append(
                PreparedBatch(
                    batch=batch, advantages=advantages[start : start + size], ref_logprobs=ref, old_logprobs=old
                )
            )
            start += size
        return prepared

    def accumulate_gradients(
        self, prepared: Sequence[PreparedBatch], normalizer: float | None = None
    ) -> dict[str, float]:
        """Zero the gradients, then back-propagate every micro-batch's share of the step's loss.

        Each micro-batch's loss is divided by ``normalizer``, the whole step's count (generated tokens,
        or sequences with sequence aggregation; by default that of ``prepared``, right on one rank), so
        the accumulated gradient (summed over ranks) is that of the loss of the whole batch. Returns the
        loss and the loss diagnostics combined over micro-batches and ranks (token-weighted means; maxima
        for ``*_max``).
        """
        if normalizer is None:
            if self.loss_config.aggregation is LossAggregation.TOKEN:
                normalizer = float(sum(p.batch.generated_tokens for p in prepared))
            else:
                normalizer = float(sum(p.batch.input_ids.shape[0] for p in prepared))
            if sum(p.batch.generated_tokens for p in prepared) == 0:
                raise ValueError("the step's samples have no generated token to train on")
        self.optimizer.zero_grad(set_to_none=True)
        # The statistics stay on the device until every micro-batch is queued: one transfer at the end.
        sums: dict[str, torch.Tensor] = {}
        weights: dict[str, float] = {}
        maxima: dict[str, torch.Tensor] = {}
        total_loss: torch.Tensor | float = 0.0
        for part in prepared:
            dropout = adapter_dropout(self.model) if self.lora else contextlib.nullcontext()
            recompute = checkpointed_layers(self.model) if self._recomputes(part.batch) else contextlib.nullcontext()
            with self._autocast(), dropout, recompute:
                logprobs = token_logprobs(self.model, part.batch, self.temperature, packed=self.packed)
            inputs = LossInputs(
                logprobs=logprobs,
                # With one mini-batch these weights are still the old policy: its own forward, detached.
                old_logprobs=logprobs.detach() if part.old_logprobs is None else part.old_logprobs,
                generation_logprobs=part.batch.generation_logprobs,
                advantages=part.advantages,
                mask=part.batch.loss_mask,
                ref_logprobs=part.ref_logprobs,
            )
            loss, statistics = policy_loss_statistics(inputs, self.loss_config, normalizer=normalizer)
            loss.backward()
            total_loss = total_loss + statistics.pop("loss")
            tokens = part.batch.generated_tokens
            for key, value in statistics.items():  # padding (no tokens) adds the keys, not the values
                if key.endswith("_max"):
                    maxima[key] = torch.maximum(maxima[key], value) if key in maxima else value
                else:
                    sums[key] = sums.get(key, 0.0) + value * tokens
                    weights[key] = weights.get(key, 0.0) + tokens
        # Means and maxima have distinct keys (maxima end in "_max"); -inf (no token here) stays for the ranks' max.
        host = tensors_to_floats({"loss": torch.as_tensor(total_loss), **sums, **maxima})
        host_sums, host_maxima = {k: host[k] for k in sums}, {k: host[k] for k in maxima}
        return combine_rank_metrics(host["loss"], host_sums, weights, host_maxima)

    def _recomputes(self, batch: TokenBatch) -> bool:
        """Whether ``batch``'s forward recomputes its activations in the backward pass: as
        ``checkpointing`` says, or when unset, where keeping them would not fit the GPU's free memory."""
        if self.checkpointing is not None:
            return self.checkpointing
        if self.device.type != "cuda":  # the layers the model enabled, if any (the worker enables none here)
            return True
        free = torch.cuda.mem_get_info(self.device)[0] + torch.cuda.memory_reserved(self.device)
        free -= torch.cuda.memory_allocated(self.device)
        trained = [p for group in self.optimizer.param_groups for p in group["params"]]
        pending = 0.0  # gradients and AdamW's state not yet allocated, float32, this rank's shard
        if any(p.grad is None for p in trained):
            pending += 4 * sum(p.numel() for p in trained) / self.world
        if not self.optimizer.state:
            pending += 8 * sum(p.numel() for p in trained) / self.world
        bf16 = self.autocast_dtype is not None
        recompute = memory.needs_checkpointing(
            self.shape, tokens=batch.tokens, free_bytes=free, pending_bytes=pending, bf16=bf16
        )
        if self.world > 1:  # the ranks run each micro-batch's collectives alike
            recompute = all_reduce([float(recompute)], "max")[0] > 0
        if recompute and not self._told_recompute:
            log.info("a micro-batch of %d tokens recomputes its activations to fit the GPU", batch.tokens)
            self._told_recompute = True
        return recompute

    def optimizer_step(self) -> dict[str, float]:
        """Clip the accumulated gradients to ``max_grad_norm`` (their norm over all ranks' shards) and
        take one AdamW step."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": float(grad_norm), "lr": float(self.optimizer.param_groups[0]["lr"])}

    # ----------------------------------------------------------------------------------------------

    def train_step(self, samples: Sequence[TrainingSample], timer: StepTimer | None = None) -> dict[str, float]:
        """One GRPO step on the step's samples (all groups); returns its metrics.

        Metrics: ``loss``, ``grad_norm``, ``lr``, the loss diagnostics of `policy_loss`, ``reward_mean``,
        ``advantage_abs_mean``, ``tokens`` (non-padding), ``generated_tokens``, ``time/prepare`` (`prepare`),
        ``time/training`` and ``train_tokens_per_s`` (tokens through forward and backward per second of
        the training phase). With ``timer``, the two phases are also recorded in it.
        """
        if not samples:
            raise ValueError("train_step needs at least one sample")
        generated = step_normalizer(samples, LossAggregation.TOKEN)
        if generated == 0:
            raise ValueError("the step's samples have no generated token to train on")
        timer = timer if timer is not None else StepTimer()
        before_prepare = timer.seconds.get(PREPARE, 0.0)
        before_training = timer.seconds.get(TRAINING, 0.0)
        advantages = self.step_advantages(samples)
        parts = mini_batch_bounds(len(samples), self.mini_batches)
        several = len(parts) > 1
        with timer.phase(PREPARE):
            prepared = [
                self.prepare(samples[start:stop], advantages[start:stop], old_logprobs=several) for start, stop in parts
            ]
        per_part = []
        with timer.phase(TRAINING):
            for (start, stop), part in zip(parts, prepared, strict=True):
                normalizer = step_normalizer(samples[start:stop], self.loss_config.aggregation)
                part_metrics = self.accumulate_gradients(part, normalizer) if normalizer else None
                if part_metrics is not None:  # a mini-batch of prompt-only samples has nothing to train
                    per_part.append(part_metrics | self.optimizer_step())
        metrics = combine_mini_batch_metrics(per_part)
        training_seconds = timer.seconds[TRAINING] - before_training
        (slowest_training_seconds,) = all_reduce([training_seconds], "max")
        tokens = sum(len(s.token_ids) for s in samples)
        metrics |= {
            "reward_mean": sum(s.reward for s in samples) / len(samples),
            "advantage_abs_mean": float(advantages.abs().mean()),
            "optimizer_steps": float(len(per_part)),
            "tokens": float(tokens),
            "generated_tokens": generated,
            "time/prepare": timer.seconds[PREPARE] - before_prepare,
            "time/training": training_seconds,
            "train_tokens_per_s": tokens_per_second(tokens, slowest_training_seconds),
        }
        return metrics


@contextlib.contextmanager
def checkpointed_layers(model: torch.nn.Module) -> Iterator[None]:
    """While active, the layers whose activations are checkpointed (`gradient_checkpointing_enable`) are in
    training mode, which transformers checks before it checkpoints; their submodules (attention, dropout)
    stay in eval mode, so the forward computes the same values. Without this the policy, always in eval
    mode, would keep every activation whatever `spec.training.gradientCheckpointing` says."""
    layers = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True and not m.training]
    for layer in layers:
        layer.training = True
    try:
        yield
    finally:
        for layer in layers:
            layer.training = False


def mini_batch_bounds(samples: int, mini_batches: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each of ``mini_batches`` contiguous parts of ``samples`` (sizes differ by at most
    one; fewer parts when there are fewer samples)."""
    parts = min(mini_batches, samples)
    size, extra = divmod(samples, parts)
    bounds, start = [], 0
    for index in range(parts):
        stop = start + size + (1 if index < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def combine_mini_batch_metrics(per_part: Sequence[dict[str, float]]) -> dict[str, float]:
    """The step's metrics from each mini-batch's: maxima for ``*_max``, means otherwise (the loss and
    ``grad_norm`` are those of an average mini-batch)."""
    keys = per_part[0].keys()
    return {
        key: max(m[key] for m in per_part) if key.endswith("_max") else sum(m[key] for m in per_part) / len(per_part)
        for key in keys
    }


def combine_rank_metrics(
    loss: float, sums: dict[str, float], weights: dict[str, float], maxima: dict[str, float]
) -> dict[str, float]:
    """The step's loss diagnostics from each rank's ``loss`` (its share of the step's loss), token-weighted
    ``sums`` and their ``weights``, and ``maxima``: summed or maximised over all ranks (every rank must
    call this with the same keys). Means of no token are 0, maxima of no token 0."""
    mean_keys, max_keys = sorted(sums), sorted(maxima)
    totals = all_reduce([loss] + [sums[k] for k in mean_keys] + [weights[k] for k in mean_keys], "sum")
    peaks = all_reduce([maxima[k] for k in max_keys], "max")
    count = len(mean_keys)
    out = {
        key: totals[1 + i] / totals[1 + count + i] if totals[1 + count + i] else 0.0 for i, key in enumerate(mean_keys)
    }
    out |= {key: value if math.isfinite(value) else 0.0 for key, value in zip(max_keys, peaks, strict=True)}
    out["loss"] = totals[0]
    return out
