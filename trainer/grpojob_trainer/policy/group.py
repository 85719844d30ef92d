"""The driver's handle on the policy: its ranks (`PolicyWorker` Ray actors) behind blocking methods.

A call that touches the parameters (training, checkpoints, gathering the weights) goes to every rank at
once, since gathering sharded parameters is a collective; the result is rank 0's. Calls about the
weight transport's setup (the GPU's UUID, the bucket layouts, the broadcast group) go to rank 0 alone,
the rank that sends to the engines. A Ray actor runs its calls one at a time in the order they were
made, so every rank sees the same sequence of collectives.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from grpojob_trainer.algorithm.samples import TrainingSample
from grpojob_trainer.errors import UsageError

if TYPE_CHECKING:
    from grpojob_trainer.policy.checkpoint import CheckpointRequest
    from grpojob_trainer.policy.checkpoint_writer import WrittenCheckpoint


class PolicyGroup:
    """The ranks of the policy, started (see `start`), rank 0 first."""

    def __init__(self, ranks: Sequence[Any]) -> None:
        if not ranks:
            raise ValueError("a policy needs at least one rank")
        self.ranks = list(ranks)

    @classmethod
    def start(cls, ranks: Sequence[Any], timeout_s: float | None = None) -> PolicyGroup:
        """Start the ranks (actors of `PolicyWorker` for ranks 0 … n-1): they load the model and join
        their process group at rank 0's rendezvous address. Returns when all are ready."""
        import ray

        host, port = ray.get(ranks[0].rendezvous_address.remote(), timeout=timeout_s)
        try:
            ray.get([rank.start.remote(host, port) for rank in ranks], timeout=timeout_s)
        except UsageError as error:  # a rank refused the spec (Ray's error is also ours): its message alone
            raise UsageError(str(getattr(error, "cause", error))) from None
        return cls(ranks)

    def _on_every_rank(self, method: str, *args: Any) -> Any:
        """``method(*args)`` on every rank; rank 0's result once all have returned."""
        import ray

        return ray.get([getattr(rank, method).remote(*args) for rank in self.ranks])[0]

    def _of_every_rank(self, method: str, *args: Any) -> list[Any]:
        """``method(*args)`` on every rank; every rank's result, rank 0's first."""
        import ray

        return ray.get([getattr(rank, method).remote(*args) for rank in self.ranks])

    def _on_rank0(self, method: str, *args: Any) -> Any:
        import ray

        return ray.get(getattr(self.ranks[0], method).remote(*args))

    # training and checkpoints

    def train_step(self, samples: list[TrainingSample]) -> dict[str, float]:
        """One GRPO step; every rank receives all the samples (one object) and trains on its share."""
        import ray

        return self._on_every_rank("train_step", ray.put(samples))

    def resume(self, directory: str) -> tuple[int, dict[str, Any]] | None:
        """Load the newest checkpoint in ``directory`` on every rank; (its step, data position) or None."""
        return self._on_every_rank("resume", directory)

    def save(self, request: CheckpointRequest) -> list[WrittenCheckpoint]:
        """Start the checkpoint ``request`` asks for: gathered from every rank and copied into rank 0's memory
        (after the write before has finished), then written by rank 0 in the background, which keeps the newest
        ``request.keep`` and that of ``request.kept_step``. Returns once the state is copied (the policy may train
        on) with the writes finished since the last report, the one before among them; `checkpoints_written` says
        when this one is on disk."""
        return self._on_every_rank("save", request)

    def checkpoints_written(self, wait: bool = False) -> list[WrittenCheckpoint]:
        """The checkpoints written since the last call, oldest first (``wait``: once the write in flight has
        finished); raises the error of a write that failed."""
        return self._on_rank0("checkpoints_written", wait)

    def export_checkpoint(self, checkpoint: str, out: str, dtype: str, output_format: str = "merged") -> str:
        """Write the model of ``checkpoint`` at ``out`` as `export` writes the live policy's (on rank 0, where
        the checkpoint and output volumes are mounted); its path."""
        return self._on_rank0("export_checkpoint", checkpoint, out, dtype, output_format)

    def export(self, out: str, dtype: str, keep: int | None = None, output_format: str = "merged") -> str:
        """Write the policy as a Hugging Face model directory (or, for ``output_format`` ``adapter``, a LoRA
        policy's adapter directory) at ``out`` (gathered from every rank, written by rank 0, which then keeps
        the newest ``keep`` of the `step_*` models beside it, if given); its path."""
        return self._on_every_rank("export", out, dtype, keep, output_format)

    # weights to the engines

    def adapter_config(self) -> dict[str, Any] | None:
        """A LoRA policy's adapter config (PEFT's ``adapter_config.json``); None for a full fine-tune."""
        return self._on_rank0("adapter_config")

    def weights(self, content: str = "weights") -> Any:
        """The tensors of ``content`` (`PolicyWorker._sync_tensors`) on the CPU, as a Ray object (an
        ObjectRef of rank 0's named tensors) for the engines to read; returns when every rank has taken
        part in gathering them."""
        import ray

        refs = [rank.weights.remote(content) for rank in self.ranks]
        ray.get(refs[1:])
        return refs[0]

    def device_uuids(self) -> list[str | None]:
        """Every rank's GPU, rank 0's first (None on the CPU)."""
        return self._of_every_rank("device_uuid")

    def bucket_layouts(self, bucket_bytes: int, content: str = "weights") -> list[Any]:
        """How the tensors of ``content`` are packed into buckets (every rank computes it: the first time,
        gathering the shapes is a collective)."""
        return self._on_every_rank("bucket_layouts", bucket_bytes, content)

    def share_weights_ipc(
        self, bucket_bytes: int, content: str = "weights", sharing: Collection[int] = (0,)
    ) -> list[Any]:
        """Start every rank packing the buckets of ``content`` (the gather is a collective): their ObjectRefs,
        rank 0's first. The value of each rank in ``sharing`` is the CUDA IPC payload of buckets on its GPU
        (kept alive until `release_shared_weights`), the others' None. An engine handed a rank's ref waits
        for it itself: the payload does not pass through the driver."""
        return [rank.share_weights_ipc.remote(bucket_bytes, content, i in sharing) for i, rank in enumerate(self.ranks)]

    def release_shared_weights(self) -> None:
        self._on_every_rank("release_shared_weights")

    def free_cached_memory(self) -> None:
        """Every rank hands the GPU memory its allocator caches back to the GPU (for an engine to wake into)."""
        self._on_every_rank("free_cached_memory")

    def weight_group_address(self) -> tuple[str, int]:
        return self._on_rank0("weight_group_address")

    def join_weight_group(self, host: str, port: int, world_size: int, receivers: Sequence[Any] = ()) -> list[Any]:
        """Rank 0 joins the broadcast group as its rank 0, while ``receivers`` (the engines' pending join
        calls, ObjectRefs) join it; their results."""
        import ray

        _, *joined = ray.get([self.ranks[0].join_weight_group.remote(host, port, world_size), *receivers])
        return joined

    def broadcast_weights(
        self, bucket_bytes: int, receivers: Sequence[Any] = (), content: str = "weights"
    ) -> tuple[int, list[Any]]:
        """Broadcast the buckets of ``content`` from rank 0 while ``receivers`` (the engines' pending receive
        calls, ObjectRefs) take them; the bytes sent and the receivers' results."""
        import ray

        sent = [rank.broadcast_weights.remote(bucket_bytes, content) for rank in self.ranks]
        results = ray.get([*sent, *receivers])
        return results[0], results[len(sent) :]
