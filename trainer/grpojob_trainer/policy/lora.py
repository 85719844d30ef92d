"""LoRA: the policy as a `peft` adapter over a frozen base model, and the adapter's tensors by name.

With `spec.training.lora` the policy is ``get_peft_model(base, LoraConfig(...))``: only the adapter's
``lora_A``/``lora_B`` matrices train, the optimizer holds only them, and what leaves the policy (to the
engines, into checkpoints, into an adapter directory) is the adapter alone, named as PEFT's files name
it (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``: the parameter's name without
the adapter's name ``default``). vLLM and `peft` load adapters named so.

A merged model is the base's weights with each adapted linear's ``W + (alpha / rank) * B @ A``
(`merge_adapter`): what an exported model holds by default, and what an engine that cannot serve LoRA
receives instead of the adapter.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import torch

from grpojob_api.v1alpha1 import LoraSpec
from grpojob_trainer.errors import UsageError

ADAPTER_NAME = "default"
"""The name `peft` gives the one adapter of a model made by ``get_peft_model``."""
PEFT_PREFIX = "base_model.model."
"""What `peft` puts before the base model's own module names."""


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The own names (``q_proj``) of the linear modules inside the model's decoder layers, in order of
    first appearance: the projections of attention and MLP, not the output head."""
    from grpojob_trainer.policy.ranks import decoder_layers

    names: dict[str, None] = {}
    for layer in decoder_layers(model):
        for path, module in layer.named_modules():
            if isinstance(module, torch.nn.Linear) and path:
                names.setdefault(path.rsplit(".", 1)[-1], None)
    return list(names)


def target_modules(model: torch.nn.Module, spec: LoraSpec) -> list[str]:
    """The modules that get an adapter: ``spec.target_modules``, each of which must name a linear module
    of the model, or by default every linear projection of the decoder layers (`linear_module_names`)."""
    available = linear_module_names(model)
    if spec.target_modules is None:
        if not available:
            raise UsageError(f"spec.training.lora: {type(model).__name__} has no linear module in its decoder layers")
        return available
    unknown = [name for name in spec.target_modules if name not in available]
    if unknown:
        raise UsageError(
            f"spec.training.lora.targetModules: {type(model).__name__} has no linear module named "
            f"{', '.join(repr(n) for n in unknown)} in its decoder layers (it has: {', '.join(available)})"
        )
    return list(spec.target_modules)


def lora_config(spec: LoraSpec, targets: list[str]) -> Any:
    """`peft.LoraConfig` of ``spec`` over ``targets``."""
    from peft import LoraConfig

    return LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )


def apply_lora(model: torch.nn.Module, spec: LoraSpec) -> torch.nn.Module:
    """``model`` frozen, with a trainable LoRA adapter of ``spec`` on its `target_modules` (a
    `peft.PeftModel`, in eval mode as the policy always is; the adapter's parameters float32 whatever
    the base's dtype)."""
    from peft import get_peft_model

    return get_peft_model(model, lora_config(spec, target_modules(model, spec))).eval()


def is_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a `peft` model (a LoRA policy)."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def adapter_config(model: torch.nn.Module, base_model: str) -> dict[str, Any]:
    """The adapter's ``adapter_config.json`` (PEFT's format), naming ``base_model`` as its base."""
    config = model.peft_config[ADAPTER_NAME].to_dict()
    config["base_model_name_or_path"] = base_model
    # Plain JSON values (PEFT keeps sets and enums): the config travels to engines and into files.
    return json.loads(json.dumps(config, default=lambda v: sorted(v) if isinstance(v, set) else str(v)))


def adapter_file_name(parameter_name: str) -> str:
    """A LoRA parameter's name as PEFT's adapter files write it: without the adapter's name."""
    return parameter_name.replace(f".{ADAPTER_NAME}.", ".")


def adapter_parameter_name(file_name: str) -> str:
    """The inverse of `adapter_file_name` (``...lora_A.weight`` → ``...lora_A.default.weight``)."""
    for part in ("lora_A", "lora_B"):
        file_name = file_name.replace(f".{part}.", f".{part}.{ADAPTER_NAME}.")
    return file_name


def adapter_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The adapter's parameters (the trainable ones), detached, under their file names (`adapter_file_name`).
    A parameter sharded by FSDP2 is gathered into its full tensor (every rank must iterate)."""
    from grpojob_trainer.policy.ranks import full_tensor

    for name, param in model.named_parameters():
        if param.requires_grad:
            yield adapter_file_name(name), full_tensor(param.detach())


def scale(config: dict[str, Any]) -> float:
    """How much of ``B @ A`` an adapter of this ``adapter_config`` adds: ``alpha / rank``."""
    return float(config["lora_alpha"]) / float(config["r"])


def merge_adapter(
    base: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor], config: dict[str, Any]
) -> dict[str, torch.Tensor]:
    """The merged model's weights: ``base`` (the base model's tensors under their own names) with
    ``W + scale * B @ A`` for every adapted linear of ``adapter`` (tensors under their file names),
    computed in float32 and returned in each base tensor's dtype. Raises when an adapter tensor has no
    base weight to merge into."""
    merged = dict(base)
    factor = scale(config)
    for name, lora_a in adapter.items():
        if ".lora_A." not in name:
            continue
        module = name.split(".lora_A.")[0]
        lora_b = adapter[f"{module}.lora_B.weight"]
        target = module.removeprefix(PEFT_PREFIX) + ".weight"
        if target not in merged:
            raise KeyError(f"the adapter's {module} has no base weight {target}")
        weight = merged[target]
        update = lora_b.float().to(weight.device) @ lora_a.float().to(weight.device)
        merged[target] = (weight.float() + factor * update).to(weight.dtype)
    return merged


def base_weight_name(parameter_name: str) -> str:
    """A `peft` model's base parameter (``base_model.model.X.base_layer.weight``) under the base model's
    own name (``X.weight``)."""
    return parameter_name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


def merged_weights(model: torch.nn.Module, config: dict[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """The merged model's parameters (base names, tied parameters once), one adapted linear at a time, for
    engines that cannot serve LoRA. Parameters sharded by FSDP2 are gathered (every rank must iterate)."""
    from grpojob_trainer.policy.ranks import full_tensor

    parameters = dict(model.named_parameters())
    factor = scale(config)
    for name, param in parameters.items():
        if param.requires_grad:
            continue
        weight = full_tensor(param.detach())
        if name.endswith(".base_layer.weight"):  # an adapted linear's weight (not its bias)
            module = name.removesuffix(".base_layer.weight")
            lora_a = full_tensor(parameters[f"{module}.lora_A.{ADAPTER_NAME}.weight"].detach())
            lora_b = full_tensor(parameters[f"{module}.lora_B.{ADAPTER_NAME}.weight"].detach())
            weight = (weight.float() + factor * (lora_b.float() @ lora_a.float())).to(weight.dtype)
        yield base_weight_name(name), weight


@contextlib.contextmanager
def adapter_dropout(model: torch.nn.Module) -> Iterator[None]:
    """While active, the adapter's dropout modules (``lora_dropout``) are in training mode; the rest of the
    model stays in eval mode (the policy's forwards compute the sampling distribution's log-probabilities)."""
    dropouts = [m for name, m in model.named_modules() if name.endswith(f"lora_dropout.{ADAPTER_NAME}")]
    for module in dropouts:
        module.train()
    try:
        yield
    finally:
        for module in dropouts:
            module.eval()
