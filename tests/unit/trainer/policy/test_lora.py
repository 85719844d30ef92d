"""A LoRA policy (`spec.training.lora`): a `peft` adapter over a frozen base, trained, checkpointed, merged
and sent to engines as the adapter alone."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import safetensors.torch
import torch

from grpojob_api.v1alpha1 import AdvantageSpec, LoraSpec, OptimizerSpec
from grpojob_trainer.algorithm.grpo import LossConfig
from grpojob_trainer.errors import UsageError
from grpojob_trainer.policy import lora
from grpojob_trainer.policy.checkpoint import load_checkpoint, save_checkpoint
from grpojob_trainer.policy.forward import build_batch, token_logprobs
from grpojob_trainer.policy.learner import PolicyLearner

from .models import tiny_causal_lm
from .test_fsdp_policy import step_samples

PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SPEC = LoraSpec(rank=4, alpha=8)


def lora_model(seed: int = 1, spec: LoraSpec = SPEC, adapter_seed: int | None = None) -> torch.nn.Module:
    """A tiny policy with a LoRA adapter; with ``adapter_seed``, its B matrices random (not the zeros a new
    adapter starts from), so that the adapter changes what the model computes."""
    model = lora.apply_lora(tiny_causal_lm(seed=seed, tied=True), spec)
    if adapter_seed is not None:
        generator = torch.Generator().manual_seed(adapter_seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if ".lora_B." in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    return model


def new_trainer(model: torch.nn.Module, kl_coef: float = 0.05, mesh=None) -> PolicyLearner:
    return PolicyLearner(
        model,
        optimizer=OptimizerSpec(learningRate=1e-2, weightDecay=0.0),
        loss=LossConfig(kl_coef=kl_coef),
        advantage=AdvantageSpec(),
        micro_batch_size=2,
        temperature=0.9,
        pad_token_id=0,
        mesh=mesh,
    )


def logits(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits.float()


TOKENS = [3, 17, 5, 40, 22, 9, 31]


# --------------------------------------------------------------------------------------------------
# which modules get an adapter


def test_by_default_every_linear_projection_of_attention_and_mlp_gets_an_adapter():
    assert lora.target_modules(tiny_causal_lm(), LoraSpec()) == PROJECTIONS


def test_named_target_modules_are_used_as_given():
    assert lora.target_modules(tiny_causal_lm(), LoraSpec(targetModules=["v_proj", "q_proj"])) == ["v_proj", "q_proj"]


def test_a_target_module_the_model_lacks_is_refused_by_name_with_the_ones_it_has():
    with pytest.raises(UsageError) as error:
        lora.target_modules(tiny_causal_lm(), LoraSpec(targetModules=["q_proj", "qkv_proj", "lm_head"]))
    message = str(error.value)
    assert "spec.training.lora.targetModules" in message
    assert "'qkv_proj', 'lm_head'" in message
    assert "it has: " + ", ".join(PROJECTIONS) in message


# --------------------------------------------------------------------------------------------------
# training


def test_only_the_adapter_trains_and_the_optimizer_holds_only_the_adapter():
    model = lora_model()
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    base = {name: p.detach().clone() for name, p in model.named_parameters() if not p.requires_grad}
    adapter = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    trainer = new_trainer(model)
    assert sum(len(g["params"]) for g in trainer.optimizer.param_groups) == len(trainable)

    metrics = trainer.train_step(step_samples())

    assert metrics["grad_norm"] > 0
    for name, param in model.named_parameters():
        if name in base:
            assert torch.equal(param, base[name]), f"the frozen base changed: {name}"
    assert any(not torch.equal(p, adapter[n]) for n, p in model.named_parameters() if n in adapter)


def test_the_reference_of_a_lora_policy_is_its_base_without_a_copy():
    model = lora_model(adapter_seed=4)  # the policy differs from its base
    base = tiny_causal_lm(seed=1, tied=True)
    trainer = new_trainer(model, kl_coef=0.1)
    assert trainer.reference_model is None

    samples = step_samples(2)
    (prepared,) = trainer.prepare(samples)
    expected = token_logprobs(base, build_batch(samples, 0), 0.9)
    mask = prepared.batch.loss_mask
    torch.testing.assert_close(prepared.ref_logprobs[mask], expected.detach()[mask])
    policy = token_logprobs(model, build_batch(samples, 0), 0.9).detach()
    assert not torch.allclose(policy[mask], expected.detach()[mask]), "the adapter must be on outside the reference"


def test_a_new_adapter_starts_as_its_base_so_the_first_step_has_no_kl():
    metrics = new_trainer(lora_model(), kl_coef=0.1).train_step(step_samples())
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-6)


def test_adapter_dropout_acts_in_the_training_forward_only():
    model = lora_model(spec=LoraSpec(rank=4, alpha=8, dropout=0.5), adapter_seed=2)
    evaluated = logits(model, TOKENS)
    assert torch.equal(logits(model, TOKENS), evaluated)  # eval mode: no dropout
    with lora.adapter_dropout(model):
        assert not torch.allclose(logits(model, TOKENS), evaluated)
        assert all(not m.training for n, m in model.named_modules() if "lora_dropout" not in n and n)
    assert torch.equal(logits(model, TOKENS), evaluated)


# --------------------------------------------------------------------------------------------------
# the adapter's tensors, and merging them


def test_the_adapter_leaves_under_peft_file_names():
    names = dict(lora.adapter_weights(lora_model()))
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in names
    assert all(".default." not in n and (".lora_A." in n or ".lora_B." in n) for n in names)
    assert len(names) == 2 * len(PROJECTIONS) * 2  # A and B, seven projections, two layers
    assert lora.adapter_parameter_name(lora.adapter_file_name("x.lora_B.default.weight")) == "x.lora_B.default.weight"


def test_merging_computes_what_peft_merges():
    model = lora_model(adapter_seed=3)
    config = lora.adapter_config(model, "base")
    adapter = dict(lora.adapter_weights(model))
    expected = copy.deepcopy(model).merge_and_unload().state_dict()

    ours = lora.merge_adapter(tiny_causal_lm(seed=1, tied=True).state_dict(), adapter, config)
    streamed = dict(lora.merged_weights(model, config))

    for name, tensor in expected.items():
        torch.testing.assert_close(ours[name], tensor, msg=name)
        if name != "lm_head.weight":  # tied: sent once, as the embedding
            torch.testing.assert_close(streamed[name], tensor, msg=name)
    assert set(streamed) == set(expected) - {"lm_head.weight"}


def test_the_adapter_config_is_peft_s_with_the_base_named():
    config = lora.adapter_config(lora_model(spec=LoraSpec(rank=8, alpha=16, dropout=0.1)), "/models/base")
    assert config["r"] == 8 and config["lora_alpha"] == 16 and config["lora_dropout"] == 0.1
    assert config["peft_type"] == "LORA" and config["base_model_name_or_path"] == "/models/base"
    assert sorted(config["target_modules"]) == sorted(PROJECTIONS)


# --------------------------------------------------------------------------------------------------
# checkpoints


def test_a_lora_checkpoint_holds_the_adapter_and_its_optimizer_state_and_resumes(tmp_path: Path):
    trainer = new_trainer(lora_model())
    trainer.train_step(step_samples())
    path = save_checkpoint(
        tmp_path, step=1, model=trainer.model, optimizer=trainer.optimizer, data_position={"row": 8}, config={}
    )
    files = sorted(p.name for p in path.iterdir())
    assert files == ["adapter_config.json", "adapter_model.safetensors", "meta.json", "optimizer.pt", "rng.pt"]
    saved = safetensors.torch.load_file(str(path / "adapter_model.safetensors"))
    assert saved.keys() == dict(lora.adapter_weights(trainer.model)).keys()

    resumed = new_trainer(lora_model(seed=1))
    info = load_checkpoint(path, model=resumed.model, optimizer=resumed.optimizer)
    assert info.step == 1 and info.data_position == {"row": 8}
    for (name, ours), (_, theirs) in zip(
        lora.adapter_weights(trainer.model), lora.adapter_weights(resumed.model), strict=True
    ):
        assert torch.equal(ours, theirs), name
    after = trainer.train_step(step_samples())
    again = resumed.train_step(step_samples())
    assert again["loss"] == pytest.approx(after["loss"], rel=1e-6)  # the optimizer state came back too
    for (name, ours), (_, theirs) in zip(
        lora.adapter_weights(trainer.model), lora.adapter_weights(resumed.model), strict=True
    ):
        torch.testing.assert_close(ours, theirs, msg=name)


def test_a_lora_checkpoint_does_not_resume_another_adapter_or_a_full_fine_tune(tmp_path: Path):
    trainer = new_trainer(lora_model())
    path = save_checkpoint(
        tmp_path, step=1, model=trainer.model, optimizer=trainer.optimizer, data_position={}, config={}
    )
    with pytest.raises(ValueError, match="rank or targetModules changed"):
        load_checkpoint(path, model=lora_model(spec=LoraSpec(rank=8, alpha=8)))
    with pytest.raises(ValueError, match=r"spec\.training\.lora changed"):
        load_checkpoint(path, model=tiny_causal_lm(seed=1, tied=True))


# --------------------------------------------------------------------------------------------------
# two ranks (FSDP2 over gloo)


def rank_lora_steps(rank: int, world: int, host: str, port: int, directory: str) -> dict:
    from grpojob_trainer.policy.ranks import init_ranks

    mesh = init_ranks(host, port, rank=rank, world=world, backend="gloo")
    trainer = new_trainer(lora_model(), mesh=mesh)
    metrics = trainer.train_step(step_samples(5))
    save_checkpoint(directory, step=1, model=trainer.model, optimizer=trainer.optimizer, data_position={}, config={})
    return {"metrics": metrics, "adapter": {n: t.clone() for n, t in lora.adapter_weights(trainer.model)}}


def test_a_lora_step_on_two_ranks_equals_the_step_on_one_and_its_checkpoint_resumes_on_one(tmp_path: Path):
    from tests.distributed import run_on_ranks

    ranks = run_on_ranks(rank_lora_steps, 2, str(tmp_path))
    one = new_trainer(lora_model())
    metrics = one.train_step(step_samples(5))
    for name, tensor in lora.adapter_weights(one.model):
        torch.testing.assert_close(ranks[0]["adapter"][name], tensor, atol=2e-6, rtol=1e-4, msg=name)
        assert torch.equal(ranks[1]["adapter"][name], ranks[0]["adapter"][name])
    for key in ("loss", "grad_norm", "kl"):
        assert ranks[0]["metrics"][key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-6), key

    resumed = new_trainer(lora_model())
    load_checkpoint(tmp_path / "step_00000001", model=resumed.model, optimizer=resumed.optimizer)
    for name, tensor in lora.adapter_weights(resumed.model):
        assert torch.equal(tensor, ranks[0]["adapter"][name]), name


def test_gradient_checkpointing_and_mini_batches_train_the_adapter_as_one_plain_step_would():
    """Checkpointed activations (the frozen embeddings made to carry gradients) and two mini-batches: the
    first mini-batch's update is the plain step's on its half of the samples."""
    plain = new_trainer(lora_model())
    checkpointed_model = tiny_causal_lm(seed=1, tied=True)
    checkpointed_model.gradient_checkpointing_enable()
    checkpointed_model.enable_input_require_grads()
    checkpointed = new_trainer(lora.apply_lora(checkpointed_model, SPEC))
    samples = step_samples()
    layer = checkpointed_model.model.layers[0]
    forwards = []
    layer.input_layernorm.register_forward_hook(lambda *_: forwards.append(1))  # recomputed in the backward
    assert plain.train_step(samples)["loss"] == pytest.approx(checkpointed.train_step(samples)["loss"], rel=1e-5)
    # 4 micro-batches: the reference's and the training forward's, and the recomputation in each backward
    assert len(forwards) == 3 * 4, "the checkpointed layer is recomputed in the backward pass"
    assert not layer.training, "the policy stays in eval mode"
    for (name, ours), (_, theirs) in zip(
        lora.adapter_weights(plain.model), lora.adapter_weights(checkpointed.model), strict=True
    ):
        torch.testing.assert_close(ours, theirs, msg=name)

    two = PolicyLearner(
        lora_model(),
        optimizer=OptimizerSpec(learningRate=1e-2, weightDecay=0.0),
        loss=LossConfig(kl_coef=0.05),
        advantage=AdvantageSpec(),
        micro_batch_size=2,
        temperature=0.9,
        pad_token_id=0,
        mini_batches=2,
    )
    metrics = two.train_step(samples)
    assert metrics["optimizer_steps"] == 2 and metrics["grad_norm"] > 0


def test_the_policy_exports_its_merged_model_and_its_adapter_as_the_files_would_give_them(tmp_path: Path):
    """`PolicyWorker.export` merges on the policy's own devices (its base held as precisely as the export
    asks); the result equals the merge of its adapter into the base's files, and the adapter directory
    serves the same model through peft."""
    import yaml
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from grpojob_api.v1alpha1 import GRPOJobSpec
    from grpojob_trainer.models.tiny import write_tiny_model
    from grpojob_trainer.policy.config import RankConfig
    from grpojob_trainer.policy.export import read_weights, write_merged_model
    from grpojob_trainer.policy.worker import PolicyWorker

    base = write_tiny_model(tmp_path / "base")
    job = yaml.safe_load((Path(__file__).resolve().parents[4] / "examples" / "tiny.yaml").read_text())
    job["spec"]["training"]["lora"] = {"rank": 4, "alpha": 8}
    worker = PolicyWorker(RankConfig(GRPOJobSpec.model_validate(job["spec"]), str(base), seed=0))
    worker.start("127.0.0.1", 0)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, param in worker.learner.model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)

    merged = Path(worker.export(str(tmp_path / "merged"), "float32"))
    adapter = Path(worker.export(str(tmp_path / "adapter"), "float32", output_format="adapter"))
    from_files = write_merged_model(
        dict(lora.adapter_weights(worker.learner.model)),
        lora.adapter_config(worker.learner.model, str(base)),
        tmp_path / "from-files",
        base=base,
        dtype="float32",
    )

    live, files = read_weights(merged), read_weights(from_files)
    assert live.keys() == files.keys()
    for name, tensor in live.items():
        torch.testing.assert_close(tensor, files[name], msg=name)
    tokens = torch.tensor([TOKENS])
    served = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)
    with torch.no_grad():
        torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(merged)(tokens).logits, served(tokens).logits)
