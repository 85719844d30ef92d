"""A safetensors file written one tensor at a time.

``safetensors.torch.save_file`` turns every tensor into bytes in host memory before it writes any: the whole
model at once. A checkpoint of a state too large to copy out of the GPU beside the rest of the pod (a full
fine-tune's) is written from the policy's own tensors instead, each copied to the host only while it is
written (`write_safetensors`). The layout is the format's: an 8-byte little-endian header length, the JSON
header (each tensor's dtype, shape and byte range, and ``__metadata__``) padded with spaces to 8 bytes, then
the tensors' bytes back to back; ``safetensors.torch.load_file`` reads it.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping

import torch

from grpojob_trainer.weight_sync.buckets import tensor_bytes

DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.uint16: "U16",
    torch.uint32: "U32",
    torch.uint64: "U64",
}


def file_order(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """The names in the order the format's own writer lays tensors out: wider elements first, then by name, so
    that every tensor starts aligned to its element size."""
    return sorted(tensors, key=lambda name: (-tensors[name].element_size(), name))


def safetensors_header(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> bytes:
    """The header of a file holding ``tensors`` in `file_order`: its length, then its JSON padded to 8 bytes."""
    if metadata and not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError(f"safetensors metadata holds strings only: {dict(metadata)}")
    entries: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name in file_order(tensors):
        tensor = tensors[name]
        if tensor.dtype not in DTYPES:
            raise ValueError(f"{name}: safetensors holds no {tensor.dtype}")
        size = tensor_bytes(tensor)
        entries[name] = {
            "dtype": DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text


def write_safetensors(
    path: str | os.PathLike[str], tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``tensors`` (on any device) to ``path`` as safetensors, copying one tensor at a time to the host:
    the host holds at most the largest tensor beside what it held already."""
    header = safetensors_header(tensors, metadata)  # what it refuses, it refuses before the file exists
    with open(path, "wb") as file:
        file.write(header)
        for name in file_order(tensors):
            tensor = tensors[name].detach()
            if tensor.numel():
                host = (tensor if tensor.is_contiguous() else tensor.contiguous()).to("cpu")
                file.write(host.reshape(-1).view(torch.uint8).numpy().data)
