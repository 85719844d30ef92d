"""The trained policy leaves the trainer as a Hugging Face model directory that `transformers` loads as it is:
its weights are the policy's (gathered from FSDP2 shards, tied weights once, in bfloat16 or float32,
sharded when large), its tokenizer and chat template the base model's. `grpojob export` does the same
from any checkpoint, and a checkpoint is itself a model directory a new job can start from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from grpojob_api import paths
from grpojob_api.v1alpha1 import GRPOJobSpec
from grpojob_trainer.cli import main
from grpojob_trainer.models.tiny import write_tiny_model
from grpojob_trainer.policy.checkpoint import CheckpointRequest
from grpojob_trainer.policy.config import RankConfig
from grpojob_trainer.policy.worker import PolicyWorker
from tests.distributed import run_on_ranks

from .test_fsdp_policy import step_samples

SPEC = {
    "model": {"path": "unused"},
    "dataset": {"path": "rows.jsonl"},
    "environments": [{"name": "arith"}],
    "generation": {"gpusPerReplica": 0, "maxModelLen": 128, "maxNewTokens": 8},
    "training": {"gpusPerReplica": 0, "microBatchSize": 2, "optimizer": {"learningRate": 0.01}},
}


@pytest.fixture(scope="module")
def base_model(tmp_path_factory) -> Path:
    """The tiny model (tied embeddings, a chat template), as a job would start from it."""
    return write_tiny_model(tmp_path_factory.mktemp("base") / "tiny")


@pytest.fixture(scope="module")
def untied_model(base_model: Path, tmp_path_factory) -> Path:
    """The tiny model's tokenizer with an untied Llama (its own output layer)."""
    out = tmp_path_factory.mktemp("untied") / "model"
    config = LlamaConfig.from_pretrained(base_model)
    config.tie_word_embeddings = False
    torch.manual_seed(1)
    LlamaForCausalLM(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(base_model).save_pretrained(out)
    return out


def trained_policy(model_dir: Path, rank: int = 0, world: int = 1, host: str = "", port: int = 0) -> PolicyWorker:
    """A policy rank started from ``model_dir`` after one training step, so its weights are no longer the base's."""
    worker = PolicyWorker(RankConfig(GRPOJobSpec.model_validate(SPEC), str(model_dir), seed=0, rank=rank, world=world))
    worker.start(host or "127.0.0.1", port or 0)
    worker.train_step(step_samples())
    return worker


def policy_state(worker: PolicyWorker) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in worker.learner.model.named_parameters()}


def assert_loads_as(out: Path, state: dict[str, torch.Tensor], base: Path, dtype: torch.dtype) -> None:
    """``out`` loads with `from_pretrained`, holds ``state`` in ``dtype``, and has the base's tokenizer."""
    loaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert next(loaded.parameters()).dtype == dtype
    params = dict(loaded.named_parameters())
    assert params.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(params[name], tensor.to(dtype)), name
    tokenizer, base_tokenizer = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(base)
    assert tokenizer.chat_template == base_tokenizer.chat_template is not None
    assert tokenizer.get_vocab() == base_tokenizer.get_vocab()
    assert (out / "generation_config.json").is_file()
    messages = [{"role": "user", "content": "1+1?"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == base_tokenizer.apply_chat_template(
        messages, tokenize=False
    )


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_exported_policy_loads_with_transformers_with_the_policys_weights(base_model, tmp_path, dtype):
    worker = trained_policy(base_model)
    out = Path(worker.export(str(tmp_path / "final"), dtype))

    assert_loads_as(out, policy_state(worker), base_model, getattr(torch, dtype))
    weights = json.loads((out / "config.json").read_text())
    assert weights["dtype"] == dtype and weights["tie_word_embeddings"] is True
    assert not (out / "lm_head.weight").exists()
    assert not list(tmp_path.glob(".tmp-*")), "no temporary directory is left"


def test_untied_output_layers_are_exported_with_their_own_weights(untied_model, tmp_path):
    worker = trained_policy(untied_model)
    out = Path(worker.export(str(tmp_path / "final"), "float32"))

    state = policy_state(worker)
    assert "lm_head.weight" in state
    assert_loads_as(out, state, untied_model, torch.float32)


def test_a_large_model_is_written_in_safetensors_shards_with_an_index(base_model, tmp_path):
    from grpojob_trainer.policy.export import read_weights, write_model

    state = read_weights(base_model)
    out = write_model(state, tmp_path / "sharded", base=base_model, dtype="float32", max_shard_size="300KB")

    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 1 and (out / "model.safetensors.index.json").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert all(torch.equal(loaded.state_dict()[name], t) for name, t in state.items())


def two_rank_export(rank: int, world: int, host: str, port: int, model_dir: str, out: str) -> dict:
    from grpojob_trainer.policy.state import gather_model_state

    worker = trained_policy(Path(model_dir), rank, world, host, port)
    gathered = gather_model_state(worker.learner.model)
    written = worker.export(out, "float32")
    return {"written": written, "gathered": gathered}


def test_a_policy_sharded_over_two_ranks_is_gathered_into_one_model(base_model, tmp_path):
    out = tmp_path / "final"
    ranks = run_on_ranks(two_rank_export, 2, str(base_model), str(out))

    assert ranks[0]["written"] == str(out) and ranks[1]["written"] is None
    gathered = ranks[0]["gathered"]
    assert_loads_as(out, gathered, base_model, torch.float32)
    one_rank = policy_state(trained_policy(base_model))
    for name, tensor in gathered.items():
        torch.testing.assert_close(tensor, one_rank[name], atol=2e-6, rtol=1e-4)


def test_grpojob_export_writes_any_checkpoints_model(base_model, tmp_path, capsys):
    worker = trained_policy(base_model)
    worker.save(CheckpointRequest(str(tmp_path / "checkpoints"), 3, {}, {}, keep=2))
    (written,) = worker.checkpoints_written(wait=True)
    checkpoint = Path(written.path)

    assert main(["export", str(tmp_path / "checkpoints"), str(tmp_path / "out"), "--dtype", "float32"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "out")
    assert_loads_as(tmp_path / "out", policy_state(worker), base_model, torch.float32)
    # The checkpoint is a model directory itself (float32), so a job can start from it.
    assert_loads_as(checkpoint, policy_state(worker), base_model, torch.float32)


def test_a_new_job_continues_from_an_earlier_jobs_checkpoint(base_model, tmp_path):
    first = trained_policy(base_model)
    first.save(CheckpointRequest(str(tmp_path / "checkpoints"), 1, {}, {}, keep=1))
    checkpoint = first.checkpoints_written(wait=True)[0].path

    continued = PolicyWorker(RankConfig(GRPOJobSpec.model_validate(SPEC), checkpoint, seed=0))
    continued.start("127.0.0.1", 0)

    assert policy_state(continued).keys() == policy_state(first).keys()
    assert all(torch.equal(t, policy_state(first)[n]) for n, t in policy_state(continued).items())
    out = Path(continued.export(str(tmp_path / "again"), "float32"))
    assert_loads_as(out, policy_state(first), base_model, torch.float32)


def test_a_checkpoint_without_the_models_files_needs_the_base_model(base_model, tmp_path, capsys):
    from grpojob_trainer.policy.checkpoint import save_checkpoint

    worker = trained_policy(base_model)
    save_checkpoint(
        tmp_path / "old",
        step=1,
        model=worker.learner.model,
        optimizer=worker.learner.optimizer,
        data_position={},
        config={},
    )

    assert main(["export", str(tmp_path / "old"), str(tmp_path / "out")]) == 2
    assert "--base" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "old"), str(tmp_path / "out"), "--base", str(base_model)]) == 0
    assert_loads_as(tmp_path / "out", policy_state(worker), base_model, torch.bfloat16)


def test_exports_with_checkpoints_keep_the_newest(tmp_path):
    from grpojob_trainer.policy.export import prune_exports

    for step in (2, 4, 6):
        (tmp_path / paths.step_model_dir(step)).mkdir()
    (tmp_path / paths.FINAL_MODEL_DIR).mkdir()

    prune_exports(tmp_path, keep=2)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["final", "step_00000004", "step_00000006"]
