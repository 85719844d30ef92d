"""A checkpoint's copy out of the GPU: into pinned host buffers kept from one checkpoint to the next, so that a
save stalls its step for the transfer alone; a state too large to keep pinned goes into new memory each time.

Runs where CUDA is present (the GPU machine); elsewhere it skips and says why."""

from __future__ import annotations

import pytest
import torch

from grpojob_trainer.policy.state import HostCopies

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the GPU machine)")


def state_on_gpu(seed: int) -> dict:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    weights = {f"layer.{i}.lora_A": torch.randn(64, 1536, device="cuda", generator=generator) for i in range(4)}
    moments = {i: {"exp_avg": torch.randn(64, 1536, device="cuda", generator=generator)} for i in range(4)}
    return {"model": weights, "optimizer": {"state": moments, "param_groups": [{"lr": 1e-4, "params": [0, 1, 2, 3]}]}}


def host_tensors(state) -> list[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for value in state.values() for t in host_tensors(value)]
    if isinstance(state, list):
        return [t for value in state for t in host_tensors(value)]
    return []


def test_a_checkpoint_is_copied_into_pinned_buffers_that_the_next_checkpoint_reuses():
    host = HostCopies()
    first_state = state_on_gpu(0)
    first = host.copy(first_state, live=set())

    copies = host_tensors(first)
    assert copies and all(t.device.type == "cpu" and t.is_pinned() for t in copies)
    assert all(torch.equal(c, g.cpu()) for c, g in zip(copies, host_tensors(first_state), strict=True))
    assert first["optimizer"]["param_groups"] == [{"lr": 1e-4, "params": [0, 1, 2, 3]}]
    where = [t.data_ptr() for t in copies]

    first_state["model"]["layer.0.lora_A"].add_(1.0)  # the policy trains on: the copy is its own
    assert not torch.equal(first["model"]["layer.0.lora_A"], first_state["model"]["layer.0.lora_A"].cpu())

    second_state = state_on_gpu(1)
    second = host.copy(second_state, live=set())
    assert [t.data_ptr() for t in host_tensors(second)] == where, "the same buffers, no new pinned memory"
    assert all(torch.equal(c, g.cpu()) for c, g in zip(host_tensors(second), host_tensors(second_state), strict=True))


def test_a_state_larger_than_what_is_kept_pinned_is_copied_into_new_memory_each_time():
    host = HostCopies(keep_bytes=1 << 20)  # the state is 1.5 MiB
    state = state_on_gpu(0)
    first, second = host.copy(state, live=set()), host.copy(state, live=set())

    assert not any(t.is_pinned() for t in host_tensors(first))
    assert {t.data_ptr() for t in host_tensors(first)}.isdisjoint(t.data_ptr() for t in host_tensors(second))
    assert all(torch.equal(c, g.cpu()) for c, g in zip(host_tensors(second), host_tensors(state), strict=True))


def test_a_lora_policys_checkpoint_on_the_gpu_holds_its_adapter_and_optimizer_as_saved(tmp_path):
    from transformers import AutoModelForCausalLM

    from grpojob_api.v1alpha1 import LoraSpec
    from grpojob_trainer.models.tiny import SHAPES, write_tiny_model
    from grpojob_trainer.policy.checkpoint import snapshot_checkpoint, write_checkpoint
    from grpojob_trainer.policy.lora import adapter_weights, apply_lora

    path = write_tiny_model(tmp_path / "model", SHAPES["small"])
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).cuda()
    model = apply_lora(base, LoraSpec(rank=8))
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2)
    host = HostCopies()

    def train_once() -> None:
        loss = sum((p.float() ** 2).sum() for p in trainable)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    train_once()
    saved = {name: tensor.detach().cpu().clone() for name, tensor in adapter_weights(model)}
    snapshot = snapshot_checkpoint(
        tmp_path / "checkpoints", step=1, model=model, optimizer=optimizer, data_position={}, config={}, host=host
    )
    assert snapshot is not None
    train_once()  # the snapshot keeps the step it was taken at

    assert set(snapshot.model_state) == set(saved)
    assert all(torch.equal(snapshot.model_state[name], saved[name]) for name in saved)
    assert all(t.is_pinned() for t in snapshot.model_state.values())
    written = write_checkpoint(snapshot)
    assert (written / "adapter_model.safetensors").is_file() and (written / "optimizer.pt").is_file()


def test_a_full_fine_tunes_state_that_would_not_fit_host_memory_is_written_from_the_gpu(tmp_path):
    from transformers import AutoModelForCausalLM

    from grpojob_trainer.models.tiny import SHAPES, write_tiny_model
    from grpojob_trainer.policy.checkpoint import load_checkpoint, snapshot_checkpoint, write_checkpoint

    path = write_tiny_model(tmp_path / "model", SHAPES["small"])
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss = sum((p.float() ** 2).sum() for p in model.parameters())
    loss.backward()
    optimizer.step()

    snapshot = snapshot_checkpoint(
        tmp_path / "checkpoints", step=1, model=model, optimizer=optimizer, data_position={}, config={},
        host=HostCopies(available=lambda: 0),
    )  # fmt: skip
    assert snapshot is not None and snapshot.live
    assert all(t.device.type == "cuda" for t in snapshot.model_state.values()), "no copy in host memory"
    written = write_checkpoint(snapshot)

    resumed = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
    resumed_optimizer = torch.optim.AdamW(resumed.parameters(), lr=1e-2)
    load_checkpoint(written, model=resumed, optimizer=resumed_optimizer, restore_rng=False)
    for (name, trained), loaded in zip(model.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(trained.cpu(), loaded), name
    moments = [s["exp_avg_sq"] for s in resumed_optimizer.state.values()]
    assert moments and all(m.device.type == "cpu" and m.abs().sum() > 0 for m in moments)
