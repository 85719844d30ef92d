"""A new adapter version written in place over an older one's, in the layout vLLM (0.26) keeps adapters in:
each registered adapter's weights by vLLM module (q/k/v packed into ``qkv_proj``, gate/up into
``gate_up_proj``: lists of slices; B already times the scaling, in the engine's dtype), and the GPU slot of
each LoRA layer (``lora_a_stacked[slice][slot, 0, :rank, :in]``, ``lora_b_stacked[slice][slot, 0, :out, :rank]``).
vLLM itself runs only on the GPU machine (tests/gpu/test_lora_vllm.py checks the engine's samples there);
here a stand-in holds that layout, filled the way vLLM's registration fills it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from grpojob_api.v1alpha1 import LoraSpec
from grpojob_trainer.generation.vllm_extension import (
    ADAPTERS_KEPT,
    InPlaceAdapter,
    adapter_destinations,
    adapter_slot,
)
from grpojob_trainer.policy import lora

DTYPE = torch.bfloat16
MAX_RANK = 16
PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@dataclass
class LoraLayer:
    lora_a_stacked: tuple[torch.Tensor, ...]
    lora_b_stacked: tuple[torch.Tensor, ...]
    tp_size: int = 1


@dataclass
class LayerWeights:
    lora_a: Any
    lora_b: Any


@dataclass
class LoRAModel:
    loras: dict[str, LayerWeights]


@dataclass
class Adapters:
    """The surface of vLLM's `LoRAModelManager` the in-place path reads."""

    modules: dict[str, LoraLayer]
    packed_modules: dict[str, list[str]]
    lora_index_to_id: list[int | None]
    registered: dict[int, LoRAModel] = field(default_factory=dict)

    def get_adapter(self, lora_id: int) -> LoRAModel | None:
        return self.registered.get(lora_id)


def parsed(name: str) -> tuple[str, bool]:
    """vLLM's `parse_fine_tuned_lora_name` for PEFT's names: the module's name without ``base_model.model.``."""
    parts = name.removeprefix("base_model.model.").split(".")
    return ".".join(parts[:-2]), parts[-2] == "lora_A"


@pytest.fixture(scope="module")
def adapters_of(tmp_path_factory) -> Any:
    from transformers import AutoModelForCausalLM

    from grpojob_trainer.models.tiny import write_tiny_model

    model_dir: Path = write_tiny_model(tmp_path_factory.mktemp("model"))
    policy = lora.apply_lora(AutoModelForCausalLM.from_pretrained(model_dir), LoraSpec(rank=8, alpha=32))

    def version(seed: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        return {name: torch.randn(t.shape, generator=generator) for name, t in lora.adapter_weights(policy)}

    return version


def empty_adapters(tensors: dict[str, torch.Tensor]) -> Adapters:
    """vLLM's LoRA layers for these tensors' modules, with 2 empty slots."""
    shapes: dict[str, dict[str, tuple[int, int]]] = {}
    for name, tensor in tensors.items():
        module, is_a = parsed(name)
        shapes.setdefault(module, {})["a" if is_a else "b"] = tuple(tensor.shape)
    modules, packed = {}, {}
    for module in {m.rsplit(".", 1)[0] for m in shapes}:
        for vllm_name, parts in [*PACKED.items(), *((n, (n,)) for n in ("o_proj", "down_proj"))]:
            found = [f"{module}.{p}" for p in parts if f"{module}.{p}" in shapes]
            if not found:
                continue
            full = f"{module}.{vllm_name}"
            modules[full] = LoraLayer(
                tuple(torch.zeros(ADAPTERS_KEPT, 1, MAX_RANK, shapes[p]["a"][1], dtype=DTYPE) for p in found),
                tuple(torch.zeros(ADAPTERS_KEPT, 1, shapes[p]["b"][0], MAX_RANK, dtype=DTYPE) for p in found),
            )
            if len(parts) > 1:
                packed[full] = found
    return Adapters(modules, packed, [None] * ADAPTERS_KEPT)


def register(adapters: Adapters, lora_id: int, tensors: dict[str, torch.Tensor], scaling: float) -> None:
    """What vLLM's registration and activation do: build the adapter's weights (cast, B times the scaling),
    pack q/k/v and gate/up, and copy them into the first free slot."""
    by_module: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        module, is_a = parsed(name)
        cast = tensor.to(DTYPE)
        by_module.setdefault(module, {})["a" if is_a else "b"] = cast if is_a else cast * scaling
    loras = {}
    index = adapters.lora_index_to_id.index(None)
    adapters.lora_index_to_id[index] = lora_id
    for full, layer in adapters.modules.items():
        parts = adapters.packed_modules.get(full, [full])
        weights = [by_module[p] for p in parts]
        a, b = [w["a"] for w in weights], [w["b"] for w in weights]
        loras[full] = LayerWeights(a, b) if full in adapters.packed_modules else LayerWeights(a[0], b[0])
        for part, (a_part, b_part) in enumerate(zip(a, b, strict=True)):
            layer.lora_a_stacked[part][index, 0, : a_part.shape[0], : a_part.shape[1]] = a_part
            layer.lora_b_stacked[part][index, 0, : b_part.shape[0], : b_part.shape[1]] = b_part
    adapters.registered[lora_id] = LoRAModel(loras)


def served(adapters: Adapters, lora_id: int, module: str, part: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The A and B that the LoRA kernels read for ``lora_id`` from ``module``'s slice ``part``."""
    index = adapters.lora_index_to_id.index(lora_id)
    layer = adapters.modules[module]
    return layer.lora_a_stacked[part][index, 0], layer.lora_b_stacked[part][index, 0]


def test_versions_take_turns_on_the_kept_ids():
    assert [adapter_slot(v) for v in range(1, 6)] == [1, 2, 1, 2, 1]
    assert {adapter_slot(v) for v in range(1, 100)} == set(range(1, ADAPTERS_KEPT + 1))


def test_each_tensor_goes_to_its_slice_of_a_packed_module_or_to_its_own():
    modules = {"m.0.attn.qkv_proj", "m.0.attn.o_proj", "m.0.mlp.gate_up_proj"}
    packed = {
        "m.0.attn.qkv_proj": ["m.0.attn.q_proj", "m.0.attn.k_proj", "m.0.attn.v_proj"],
        "m.0.mlp.gate_up_proj": ["m.0.mlp.gate_proj", "m.0.mlp.up_proj"],
    }
    tensor_modules = {
        "k.A": ("m.0.attn.k_proj", True),
        "o.B": ("m.0.attn.o_proj", False),
        "up.A": ("m.0.mlp.up_proj", True),
    }
    assert adapter_destinations(tensor_modules, modules, packed) == {
        "k.A": ("m.0.attn.qkv_proj", 1),
        "o.B": ("m.0.attn.o_proj", 0),
        "up.A": ("m.0.mlp.gate_up_proj", 1),
    }
    assert adapter_destinations({"x": ("m.0.lm_head", True)}, modules, packed) is None


def test_a_new_version_written_in_place_is_what_registering_it_would_have_served(adapters_of):
    first, second = adapters_of(1), adapters_of(2)
    adapters = empty_adapters(first)
    register(adapters, 1, first, scaling=4.0)
    places = InPlaceAdapter.locate(adapters, 1, 4.0, {name: parsed(name) for name in first})
    assert places is not None and places.holds(first) and not places.holds(second)

    places.write(second)
    expected = empty_adapters(second)
    register(expected, 1, second, scaling=4.0)
    for module in adapters.modules:
        for part in range(len(adapters.modules[module].lora_a_stacked)):
            for now, registered in zip(
                served(adapters, 1, module, part), served(expected, 1, module, part), strict=True
            ):
                assert torch.equal(now, registered), module
    assert places.holds(second) and places.still_registered(adapters, 1)
    for module, layer in adapters.modules.items():
        for part in range(len(layer.lora_a_stacked)):
            a, b = served(adapters, 1, module, part)
            assert a[8:].count_nonzero() == 0 and b[:, 8:].count_nonzero() == 0, "beyond rank 8 stays empty"


def test_the_other_slot_keeps_the_previous_version(adapters_of):
    first, second, third = adapters_of(1), adapters_of(2), adapters_of(3)
    adapters = empty_adapters(first)
    register(adapters, 1, first, scaling=4.0)
    register(adapters, 2, second, scaling=4.0)
    places = InPlaceAdapter.locate(adapters, 1, 4.0, {name: parsed(name) for name in first})
    places.write(third)
    on_two = InPlaceAdapter.locate(adapters, 2, 4.0, {name: parsed(name) for name in second})
    assert on_two.holds(second) and places.holds(third)


def test_places_that_vllm_did_not_fill_as_expected_are_not_used(adapters_of):
    first = adapters_of(1)
    adapters = empty_adapters(first)
    register(adapters, 1, first, scaling=2.0)  # another scaling than the one the writer would apply
    places = InPlaceAdapter.locate(adapters, 1, 4.0, {name: parsed(name) for name in first})
    assert places is not None and not places.holds(first)


def test_a_layer_sliced_over_ranks_or_an_unregistered_id_has_no_places(adapters_of):
    first = adapters_of(1)
    adapters = empty_adapters(first)
    assert InPlaceAdapter.locate(adapters, 1, 4.0, {name: parsed(name) for name in first}) is None
    register(adapters, 1, first, scaling=4.0)
    next(iter(adapters.modules.values())).tp_size = 2
    assert InPlaceAdapter.locate(adapters, 1, 4.0, {name: parsed(name) for name in first}) is None


def test_places_go_stale_once_vllm_rebuilds_or_moves_the_adapter(adapters_of):
    first = adapters_of(1)
    adapters = empty_adapters(first)
    register(adapters, 1, first, scaling=4.0)
    places = InPlaceAdapter.locate(adapters, 1, 4.0, {name: parsed(name) for name in first})
    assert places.still_registered(adapters, 1)
    adapters.lora_index_to_id = [None, 1]
    assert not places.still_registered(adapters, 1)
    adapters.lora_index_to_id = [1, None]
    adapters.registered[1] = LoRAModel({})
    assert not places.still_registered(adapters, 1)
