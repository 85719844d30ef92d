"""The transformers engine serving a LoRA policy: its adapter (each version replacing the last), or, where
an engine cannot serve LoRA, the adapter merged into the base as full weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpojob_api.v1alpha1 import LoraSpec
from grpojob_trainer.generation.transformers_backend import TransformersBackend
from grpojob_trainer.policy import lora

TOKENS = torch.tensor([[5, 9, 13, 21, 34, 55]])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from grpojob_trainer.models.tiny import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("model"))


def trained_policy(model_dir: Path, seed: int) -> torch.nn.Module:
    """A LoRA policy over the model whose adapter moved away from zero (as training moves it)."""
    from transformers import AutoModelForCausalLM

    policy = lora.apply_lora(AutoModelForCausalLM.from_pretrained(model_dir), LoraSpec(rank=8, alpha=32))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return policy


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(TOKENS).logits


def test_each_adapter_version_replaces_the_last_and_the_engine_computes_what_the_policy_does(model_dir: Path):
    backend = TransformersBackend(model_dir)
    base = logits(backend.model)
    first, second = trained_policy(model_dir, 1), trained_policy(model_dir, 2)
    config = lora.adapter_config(first, str(model_dir))

    assert backend.update_adapter(config, lora.adapter_weights(first)) == 1
    torch.testing.assert_close(logits(backend.model), logits(first))
    assert not torch.allclose(logits(backend.model), base, atol=1e-3)
    assert backend.update_adapter(config, lora.adapter_weights(second)) == 2
    torch.testing.assert_close(logits(backend.model), logits(second))


def test_an_adapter_that_does_not_fit_the_engine_is_refused(model_dir: Path):
    backend = TransformersBackend(model_dir)
    policy = trained_policy(model_dir, 1)
    config = lora.adapter_config(policy, str(model_dir))
    backend.update_adapter(config, lora.adapter_weights(policy))
    with pytest.raises(ValueError, match="config changed"):
        backend.update_adapter(config | {"r": 16}, lora.adapter_weights(policy))


def test_merged_weights_are_full_weights_an_engine_without_lora_loads_as_they_are(model_dir: Path):
    backend = TransformersBackend(model_dir)
    policy = trained_policy(model_dir, 3)
    backend.update_weights(lora.merged_weights(policy, lora.adapter_config(policy, str(model_dir))))
    # Merging reorders float32 sums (W + BA against Wx + B(Ax)); the difference depends on the threads torch
    # uses (it failed at 1e-5 once in the full suite), a wrong merge is off by orders of magnitude more.
    torch.testing.assert_close(logits(backend.model), logits(policy), atol=1e-4, rtol=1e-4)
