"""Bucketed weight sync: the layout, packing, and the broadcast protocol between processes (gloo on CPU;
the same code runs NCCL on GPUs, see tests/gpu)."""

from __future__ import annotations

import multiprocessing
import socket

import pytest
import torch

from grpojob_trainer.weight_sync.buckets import (
    WeightBroadcastGroup,
    fill_bucket,
    pack_bucket,
    plan_buckets,
    unpack_bucket,
)

SHAPES = [("embed", (10, 4)), ("layer.0.w", (4, 4)), ("layer.0.b", (4,)), ("big", (64, 4)), ("head.b", (3,))]


def tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=generator) for name, shape in SHAPES}


def test_buckets_hold_tensors_in_order_and_respect_the_byte_limit():
    layouts = plan_buckets(SHAPES, bucket_bytes=100, dtype=torch.bfloat16)  # 50 bf16 elements per bucket

    assert [[s.name for s in layout.slots] for layout in layouts] == [
        ["embed"],  # 40 elements; adding layer.0.w (16) would overflow
        ["layer.0.w", "layer.0.b"],
        ["big"],  # larger than a bucket: a bucket of its own
        ["head.b"],
    ]
    assert all(layout.dtype == "bfloat16" for layout in layouts)
    assert layouts[1].slots[1].offset == 16 and layouts[1].numel == 20


def test_one_bucket_when_everything_fits():
    layouts = plan_buckets(SHAPES, bucket_bytes=1 << 20, dtype=torch.float32)
    assert len(layouts) == 1 and layouts[0].numel == 40 + 16 + 4 + 256 + 3


def test_unpacked_views_equal_the_packed_tensors_cast_to_the_bucket_dtype():
    original = tensors()
    for layout in plan_buckets(SHAPES, bucket_bytes=64, dtype=torch.bfloat16):
        flat = pack_bucket(layout, original, "cpu")
        assert flat.dtype == torch.bfloat16 and flat.shape == (layout.numel,)
        for name, view in unpack_bucket(layout, flat):
            assert torch.equal(view, original[name].to(torch.bfloat16))
            assert view.data_ptr() >= flat.data_ptr()  # a view into the bucket, not a copy


def test_a_bucket_refilled_in_place_holds_the_new_tensors():
    """An adapter's bucket is shared once and refilled at every push: the views the engine opened see each
    new version."""
    layout = plan_buckets(SHAPES, bucket_bytes=1 << 20, dtype=torch.bfloat16)[0]
    first = tensors()
    flat = pack_bucket(layout, first, "cpu")
    views = dict(unpack_bucket(layout, flat))
    second = {name: tensor + 1 for name, tensor in first.items()}
    fill_bucket(layout, second, flat)
    for name, view in views.items():
        assert torch.equal(view, second[name].to(torch.bfloat16))


def test_a_bucket_of_the_wrong_size_is_refused():
    layout = plan_buckets(SHAPES, bucket_bytes=1 << 20, dtype=torch.float32)[0]
    with pytest.raises(ValueError, match="bucket of 3 elements received"):
        unpack_bucket(layout, torch.zeros(3))


def test_bucket_bytes_must_be_positive():
    with pytest.raises(ValueError, match="bucket_bytes must be positive"):
        plan_buckets(SHAPES, bucket_bytes=0, dtype=torch.float32)


def _receiver(port: int, rank: int, world: int, results) -> None:
    group = WeightBroadcastGroup("127.0.0.1", port, world_size=world, rank=rank, backend="gloo", timeout_s=60)
    layouts = plan_buckets(SHAPES, bucket_bytes=128, dtype=torch.float32)
    # numpy arrays travel through the queue by value: a torch tensor would travel as shared memory that
    # disappears when this process exits before the parent reads it (FileNotFoundError in the parent)
    received = {name: tensor.numpy().copy() for name, tensor in group.receive_buckets(layouts, "cpu")}
    results.put((rank, received))


def test_every_engine_receives_the_policy_weights_bucket_by_bucket_over_a_broadcast_group():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    world = 3
    engines = [context.Process(target=_receiver, args=(port, rank, world, results)) for rank in (1, 2)]
    for engine in engines:
        engine.start()
    policy = WeightBroadcastGroup("127.0.0.1", port, world_size=world, rank=0, backend="gloo", timeout_s=60)
    original = tensors(seed=7)
    layouts = plan_buckets(SHAPES, bucket_bytes=128, dtype=torch.float32)
    sent = policy.send_buckets(layouts, original, "cpu")

    received = dict(results.get(timeout=60) for _ in engines)
    for engine in engines:
        engine.join(timeout=30)
    assert sent == 4 * sum(t.numel() for t in original.values())
    assert len(layouts) > 1
    for rank in (1, 2):
        assert received[rank].keys() == original.keys()
        for name, tensor in original.items():
            assert torch.equal(torch.from_numpy(received[rank][name]), tensor), (rank, name)


def test_a_rank_outside_the_group_is_refused():
    with pytest.raises(ValueError, match="rank 3 is outside a group of 2"):
        WeightBroadcastGroup("127.0.0.1", 1, world_size=2, rank=3, backend="gloo")
