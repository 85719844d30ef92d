"""`spec.training.torchCompile`: unset compiles the decoder layers where the policy trains on GPUs, never on the
CPU; an explicit setting is honoured; the compiled kernels are kept in the checkpoint directory."""

from __future__ import annotations

import pytest
import torch

from grpojob_api.v1alpha1 import GRPOJobSpec
from grpojob_trainer.policy.compilation import compile_cache_dir, compiles_layers, use_compile_cache
from grpojob_trainer.policy.learner import PolicyLearner

from .models import tiny_causal_lm


def spec(**training) -> GRPOJobSpec:
    return GRPOJobSpec.model_validate(
        {
            "model": {"path": "runs/tiny-model"},
            "dataset": {"path": "train.jsonl"},
            "environments": [{"name": "digits"}],
            "training": {"microBatchSize": 2, **training},
        }
    )


def test_torch_compile_is_unset_unless_the_job_sets_it():
    assert spec().training.torch_compile is None
    assert spec(torchCompile=False).training.torch_compile is False


@pytest.mark.parametrize(
    ("setting", "device", "compiled"),
    [
        (None, "cuda", True),  # unset: the GPUs compile
        (None, "cpu", False),  # unset: the CPU does not
        (False, "cuda", False),
        (True, "cuda", True),
        (True, "cpu", False),  # ignored on the CPU
    ],
)
def test_the_layers_compile_on_gpus_unless_the_job_turns_it_off(setting, device, compiled):
    assert compiles_layers(setting, torch.device(device)) is compiled


def test_a_policy_training_on_the_cpu_with_the_default_is_not_compiled():
    learner = PolicyLearner.from_spec(tiny_causal_lm(seed=6, tied=True), spec(), pad_token_id=0)

    assert learner.compiled is False


def test_compiled_kernels_are_kept_in_the_checkpoint_directory_where_a_retry_finds_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    environ: dict[str, str] = {}

    used = use_compile_cache(compile_cache_dir("checkpoints/job"), environ)

    assert used == str(tmp_path / "checkpoints" / "job" / "compile-cache")
    assert environ == {"TORCHINDUCTOR_CACHE_DIR": used}, "Triton's kernels go under TorchInductor's cache"


def test_a_cache_directory_the_user_set_is_kept():
    environ = {"TORCHINDUCTOR_CACHE_DIR": "/cache/mine"}

    assert use_compile_cache("/claim/checkpoints/job/compile-cache", environ) == "/cache/mine"
    assert environ == {"TORCHINDUCTOR_CACHE_DIR": "/cache/mine"}
