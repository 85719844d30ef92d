"""How much GPU memory the policy needs, estimated from the model's shape before it loads.

Two uses. At start-up (`check_policy_fits`) a job that cannot fit its GPU, whatever the lengths of its
rollouts, is refused before the model loads, with the estimate and the fields to change. While training,
``spec.training.gradientCheckpointing`` unset lets each micro-batch decide (`needs_checkpointing`):
its activations are kept when they fit the GPU's free memory, recomputed in the backward pass when they
do not, so a short micro-batch runs at full speed and a long one still fits.

Activations. Per token and decoder layer a forward under bf16 autocast keeps about ``24 x hidden + 8 x
intermediate`` bytes for the backward pass (the norms' float32 inputs, the projections' bf16 inputs and
outputs, the MLP's gate, up and product); calibrated on the 7B shape with LoRA rank 64, where a micro-batch
of 8 sequences of about 580 tokens held 31 GB of activations on an H100. float32 doubles it. With
checkpointing a layer keeps only its float32 input (``4 x hidden``) and one layer's activations exist at
a time, recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpojob_trainer.errors import CannotRun

GIB = float(1 << 30)

HEAD_WORKSPACE_BYTES = (1 << 30) + (2 << 28)
"""The chunked head's softmax kept for the backward pass (up to 1 GiB) and one chunk's logits and gradient
(`grpojob_trainer.policy.logprobs`)."""

CUDA_CONTEXT_BYTES = 1 << 30
"""The CUDA context, NCCL's buffers and the allocator's fragmentation, taken as one figure."""


@dataclass(frozen=True)
class ModelShape:
    """What the memory of a decoder-only transformer depends on, read from its config."""

    parameters: int
    hidden_size: int
    intermediate_size: int
    layers: int
    vocabulary: int

    @classmethod
    def from_config(cls, config: object, parameters: int) -> ModelShape:
        """The shape of a transformers config (``hidden_size``, ``intermediate_size``,
        ``num_hidden_layers``, ``vocab_size``) with ``parameters`` counted from the model."""
        return cls(
            parameters=parameters,
            hidden_size=int(config.hidden_size),  # type: ignore[attr-defined]
            intermediate_size=int(config.intermediate_size),  # type: ignore[attr-defined]
            layers=int(config.num_hidden_layers),  # type: ignore[attr-defined]
            vocabulary=int(config.vocab_size),  # type: ignore[attr-defined]
        )

    def activation_bytes_per_token(self, *, checkpointing: bool, bf16: bool = True) -> float:
        """Bytes a forward keeps per token for the backward pass, over every layer (see the module)."""
        layer = (24 * self.hidden_size + 8 * self.intermediate_size) * (1 if bf16 else 2)
        if checkpointing:  # every layer's input, and one layer's activations while it is recomputed
            return 4 * self.hidden_size * self.layers + layer
        return layer * self.layers


@dataclass(frozen=True)
class PolicyMemory:
    """A policy rank's GPU memory, in bytes, by what holds it."""

    weights: float
    """The policy's weights: float32 master weights, or a LoRA policy's bf16 base and float32 adapter."""
    optimizer: float
    """AdamW's two float32 moments of every trained weight."""
    reference: float
    """The frozen reference copy a full fine-tune with a KL penalty keeps."""
    gradients: float
    """float32 gradients of every trained weight, alive from the first backward of a step to its end."""
    activations: float
    """One micro-batch's activations and the head's workspace."""

    @property
    def resident(self) -> float:
        """What stays on the GPU between steps, while the engines generate."""
        return self.weights + self.optimizer + self.reference + CUDA_CONTEXT_BYTES

    @property
    def training(self) -> float:
        """The peak while a step trains."""
        return self.resident + self.gradients + self.activations

    def describe(self) -> str:
        parts = [f"weights {self.weights / GIB:.1f}", f"AdamW state {self.optimizer / GIB:.1f}"]
        if self.reference:
            parts.append(f"reference copy {self.reference / GIB:.1f}")
        parts += [f"gradients {self.gradients / GIB:.1f}", f"activations {self.activations / GIB:.1f}"]
        return f"about {self.training / GIB:.1f} GiB ({', '.join(parts)} GiB)"


def estimate_policy_memory(
    shape: ModelShape,
    *,
    trained_parameters: int,
    lora: bool,
    reference: bool,
    ranks: int,
    micro_batch_tokens: int,
    checkpointing: bool,
    bf16: bool = True,
) -> PolicyMemory:
    """One rank's GPU memory for a policy of ``shape`` sharded over ``ranks`` (FSDP2), training
    ``trained_parameters`` (all of them, or a LoRA adapter's), with a micro-batch of
    ``micro_batch_tokens`` tokens; ``reference``: a frozen copy for the KL penalty."""
    base_bytes = 2 if lora and bf16 else 4  # a LoRA policy's frozen base needs no float32 master weights
    weights = (shape.parameters * base_bytes + (trained_parameters * 4 if lora else 0)) / ranks
    activations = micro_batch_tokens * shape.activation_bytes_per_token(checkpointing=checkpointing, bf16=bf16)
    return PolicyMemory(
        weights=weights,
        optimizer=trained_parameters * 8 / ranks,
        reference=shape.parameters * 4 / ranks if reference and not lora else 0.0,
        gradients=trained_parameters * 4 / ranks,
        activations=activations + HEAD_WORKSPACE_BYTES,
    )


class PolicyDoesNotFit(CannotRun, ValueError):
    """The policy cannot fit its GPU, whatever its rollouts' lengths."""


def check_policy_fits(
    memory: PolicyMemory, *, free_bytes: float, engine_bytes: float, engine_sleeps: bool, micro_batch: str
) -> None:
    """Raise `PolicyDoesNotFit`, naming the fields to change, when the policy (``memory``, estimated for
    its shortest micro-batch: ``micro_batch`` says which) cannot fit beside the engine sharing its GPU:
    its resident memory must fit ``free_bytes`` (the GPU's free memory now, the engine awake), and its
    training peak that plus ``engine_bytes`` when the engine sleeps while the policy trains."""
    while_training = free_bytes + (engine_bytes if engine_sleeps else 0.0)
    if memory.resident <= free_bytes and memory.training <= while_training:
        return
    room = free_bytes if memory.resident > free_bytes else while_training
    raise PolicyDoesNotFit(
        f"the policy does not fit its GPU: it needs {memory.describe()} for {micro_batch}, and "
        f"{room / GIB:.1f} GiB of the GPU is free for it"
        + (f" beside the generation engine's {engine_bytes / GIB:.1f} GiB" if engine_bytes else "")
        + ". Train a LoRA adapter (spec.training.lora), shard the policy over more GPUs "
        "(spec.training.replicas, spec.training.gpusPerReplica), lower spec.training.microBatchSize or "
        "spec.generation.maxNewTokens"
        + (", or give the engine less (spec.generation.gpuMemoryUtilization)" if engine_bytes else "")
    )


def needs_checkpointing(
    shape: ModelShape, *, tokens: int, free_bytes: float, pending_bytes: float, bf16: bool = True
) -> bool:
    """Whether a micro-batch of ``tokens`` tokens must recompute its activations: keeping them (with
    ``pending_bytes`` still to be allocated this step: gradients, AdamW's first state) would leave less
    than a tenth of ``free_bytes``."""
    kept = tokens * shape.activation_bytes_per_token(checkpointing=False, bf16=bf16) + HEAD_WORKSPACE_BYTES
    return kept + pending_bytes > 0.9 * free_bytes
