"""A safetensors file written one tensor at a time reads back, through safetensors itself, as the tensors that
went in: every dtype a checkpoint holds, scalars, empty and non-contiguous tensors, and the file's metadata."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch

from grpojob_trainer.policy.tensor_file import write_safetensors


def test_what_is_written_tensor_by_tensor_reads_back_through_safetensors(tmp_path: Path):
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "model.embed_tokens.weight": torch.randn(7, 5, generator=generator, dtype=torch.float32),
        "model.layers.0.mlp.weight": torch.randn(3, 4, generator=generator).to(torch.bfloat16),
        "model.norm.weight": torch.randn(5, generator=generator).to(torch.float16),
        "optimizer.step": torch.tensor(12.0),
        "positions": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.empty(0, 4),
        "transposed": torch.randn(4, 3, generator=generator).t(),
        "bytes": torch.arange(5, dtype=torch.uint8),
        "counts": torch.tensor([1, 2, 60000]).to(torch.uint16),
        "odd_bf16": torch.ones(3, dtype=torch.bfloat16),  # 6 bytes: what follows it must still start aligned
    }
    path = tmp_path / "model.safetensors"
    write_safetensors(path, tensors, metadata={"format": "pt"})

    read = safetensors.torch.load_file(str(path))
    assert read.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert read[name].dtype == tensor.dtype and read[name].shape == tensor.shape, name
        assert torch.equal(read[name], tensor), name
    with safetensors.safe_open(str(path), framework="pt") as opened:
        assert opened.metadata() == {"format": "pt"}
    header_size = int.from_bytes(path.read_bytes()[:8], "little")
    assert (8 + header_size) % 8 == 0  # the data starts 8-byte aligned, and so does each tensor in its own element
    header = json.loads(path.read_bytes()[8 : 8 + header_size])
    assert all(header[name]["data_offsets"][0] % tensor.element_size() == 0 for name, tensor in tensors.items())


def test_metadata_that_safetensors_would_not_read_back_is_refused_before_writing(tmp_path: Path):
    with pytest.raises(ValueError, match="metadata holds strings only"):
        write_safetensors(tmp_path / "x.safetensors", {"w": torch.zeros(2)}, metadata={"step": 3})  # type: ignore[dict-item]
    assert not (tmp_path / "x.safetensors").exists()


def test_a_dtype_safetensors_cannot_hold_is_refused_by_name(tmp_path: Path):
    with pytest.raises(ValueError, match=r"phase: safetensors holds no torch\.complex64"):
        write_safetensors(tmp_path / "x.safetensors", {"phase": torch.zeros(2, dtype=torch.complex64)})
