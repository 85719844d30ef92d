"""The policy as Ray actors: one `PolicyWorker` per rank, placed on the `policy` worker group.

A `policy` pod runs one `PolicyWorker` per GPU (one on a CPU pod), the ranks of the policy, which
`grpojob_trainer.policy.group.PolicyGroup` drives together. Placement uses the custom Ray resource the
RayCluster's group declares (`{"policy": GPUs}`, each rank asking for one unit); `grpojob run` declares the
same resource on its local Ray head. How weights travel policy → engines (object store, CUDA IPC or NCCL
broadcast) is `grpojob_trainer.weight_sync.paths`'s choice; the worker offers the sending end of every path.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from grpojob_api import v1alpha1 as api
from grpojob_trainer.algorithm.samples import TrainingSample
from grpojob_trainer.policy import memory
from grpojob_trainer.policy.checkpoint_writer import CheckpointWriter, WrittenCheckpoint
from grpojob_trainer.policy.compilation import compiles_layers, use_compile_cache
from grpojob_trainer.policy.config import RankConfig
from grpojob_trainer.policy.state import HostCopies

if TYPE_CHECKING:
    from grpojob_trainer.policy.checkpoint import CheckpointRequest

log = logging.getLogger(__name__)

NamedTensors = list[tuple[str, torch.Tensor]]


class SyncContent(StrEnum):
    """What the policy sends the engines after a step (`grpojob_trainer.weight_sync.paths`)."""

    WEIGHTS = "weights"
    """Every parameter (a full fine-tune)."""
    ADAPTER = "adapter"
    """A LoRA policy's adapter, for engines that serve LoRA."""
    MERGED = "merged"
    """A LoRA policy's adapter merged into its base, for engines that cannot serve LoRA."""


def _free_address() -> tuple[str, int]:
    """This node's address and a port free on it now."""
    import ray

    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    return ray.util.get_node_ip_address(), port


def memory_shape(model_path: str, lora: api.LoraSpec | None) -> tuple[memory.ModelShape, int]:
    """The `ModelShape` of the model at ``model_path`` and how many parameters its training updates (all,
    or a LoRA adapter's), counted on the meta device: nothing is loaded."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpojob_trainer.policy.lora import target_modules

    config = AutoConfig.from_pretrained(model_path, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    parameters = sum(p.numel() for p in model.parameters())
    trained = parameters
    if lora is not None:
        targets = set(target_modules(model, lora))
        linears = [m for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in targets]
        trained = sum(lora.rank * (m.in_features + m.out_features) for m in linears)
    return memory.ModelShape.from_config(config, parameters), trained


class PolicyWorker:
    """One rank of the policy being trained (a Ray actor on a `policy` worker, one per GPU).

    The ranks are driven together by `grpojob_trainer.policy.group.PolicyGroup`: `start` on every rank
    (rank 0's `rendezvous_address` first), then the same calls on every rank for anything that touches
    the (sharded) parameters: `train_step`, `save`, `export`, `resume`, `weights`, `share_weights_ipc`,
    `broadcast_weights`. Rank 0 is the one that sends the weights to the engines; the other ranks take
    part in gathering them and return nothing (None, 0 or an empty list). With one rank nothing is
    sharded and no process group is created.
    """

    def __init__(self, config: RankConfig) -> None:
        self.spec = config.spec
        self.model_path, self.seed, self.rank, self.world = config.model_path, config.seed, config.rank, config.world
        self.compile_cache_dir = config.compile_cache_dir
        self.learner: Any = None
        self._shared: list[torch.Tensor] = []
        self._adapter_buckets: dict[int, tuple[bytes, list[torch.Tensor]]] = {}
        """By bucket size: the adapter's buckets, shared once and refilled at every push, with their payload."""
        self._group: Any = None
        self._layouts: dict[int, list[Any]] = {}
        self.writer = CheckpointWriter()
        self.checkpoint_host = HostCopies()
        """Rank 0's: writes the checkpoints while the policy trains on."""

    def rendezvous_address(self) -> tuple[str, int]:
        """Rank 0: where the ranks' process group will rendezvous (this node's address, a free port)."""
        return _free_address()

    def start(self, host: str, port: int) -> None:
        """Load the model, join the ranks' process group at ``host:port`` (with several ranks: nccl on
        GPUs, gloo on the CPU) and build the learner (`PolicyLearner`: the model sharded over the ranks, its
        optimizer)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from grpojob_trainer.policy.learner import PolicyLearner
        from grpojob_trainer.policy.ranks import init_ranks

        torch.manual_seed(self.seed)
        training = self.spec.training
        on_gpu = torch.cuda.is_available()  # the GPU Ray gave this actor (none on a CPU worker)
        tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
        if on_gpu:
            self._check_fits()
        # A LoRA policy's base is frozen: it needs no float32 master weights, only the adapter does.
        frozen_bf16 = training.lora is not None and on_gpu and training.precision == "bf16"
        dtype = torch.bfloat16 if frozen_bf16 else torch.float32
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype, local_files_only=True)
        if on_gpu:
            model.to("cuda")
        # Unset: the layers can recompute their activations, and each micro-batch decides (PolicyLearner).
        checkpointing = training.gradient_checkpointing is True or (training.gradient_checkpointing is None and on_gpu)
        if checkpointing:
            model.gradient_checkpointing_enable()
        if training.lora is not None:
            from grpojob_trainer.policy.lora import apply_lora

            if checkpointing:  # the frozen embeddings' output must carry gradients through
                model.enable_input_require_grads()
            model = apply_lora(model, training.lora)
        mesh = None
        if self.world > 1:
            mesh = init_ranks(host, port, rank=self.rank, world=self.world, backend="nccl" if on_gpu else "gloo")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.compile_cache_dir is not None and compiles_layers(
            training.torch_compile, next(model.parameters()).device
        ):
            log.info("compiled kernels kept in %s", use_compile_cache(self.compile_cache_dir))
        self.learner = PolicyLearner.from_spec(model, self.spec, pad_token_id=pad, mesh=mesh)

    def _check_fits(self) -> None:
        """Refuse (`PolicyDoesNotFit`) a policy that cannot fit this GPU beside what already holds memory
        on it (a colocated engine, started first), before the model loads."""
        training = self.spec.training
        shape, trained = memory_shape(self.model_path, training.lora)
        # The shortest micro-batch the job can train: its sequences one token of prompt and all generated.
        tokens = training.micro_batch_size * (self.spec.generation.max_new_tokens + 1)
        estimate = memory.estimate_policy_memory(
            shape,
            trained_parameters=trained,
            lora=training.lora is not None,
            reference=self.spec.grpo.kl_coef > 0,
            ranks=self.world,
            micro_batch_tokens=tokens,
            checkpointing=training.gradient_checkpointing is not False,
            bf16=training.precision == "bf16",
        )
        free, total = torch.cuda.mem_get_info()
        others = max(0.0, total - free - torch.cuda.memory_reserved())
        shares_gpu = others > memory.CUDA_CONTEXT_BYTES  # a colocated engine holds its share
        memory.check_policy_fits(
            estimate,
            free_bytes=free,
            engine_bytes=others if shares_gpu else 0.0,
            engine_sleeps=self.spec.engine_sleeps(shares_gpu),
            micro_batch=f"a micro-batch of {training.micro_batch_size} sequences of "
            f"{self.spec.generation.max_new_tokens} generated tokens",
        )

    def train_step(self, samples: list[TrainingSample]) -> dict[str, float]:
        """Every rank: one GRPO step on the step's samples (this rank trains its slice); the step's metrics."""
        return self.learner.train_step(samples)

    # what the engines receive: the model's weights, a LoRA policy's adapter, or its merged weights

    def adapter_config(self) -> dict[str, Any] | None:
        """A LoRA policy's adapter config (PEFT's ``adapter_config.json``); None for a full fine-tune."""
        from grpojob_trainer.policy.lora import adapter_config, is_lora

        model = self.learner.model
        return adapter_config(model, self.model_path) if is_lora(model) else None

    def _sync_tensors(self, content: str) -> Iterator[tuple[str, torch.Tensor]]:
        """The tensors the engines receive (full tensors; every rank iterates: gathering is a collective):
        ``weights`` (every parameter), ``adapter`` (a LoRA policy's adapter, PEFT's names) or ``merged``
        (a LoRA policy's adapter merged into its base)."""
        from grpojob_trainer.policy import lora
        from grpojob_trainer.policy.ranks import trainable_weights

        model = self.learner.model
        if content == SyncContent.ADAPTER:
            return lora.adapter_weights(model)
        if content == SyncContent.MERGED:
            return lora.merged_weights(model, lora.adapter_config(model, self.model_path))
        return trainable_weights(model)

    def weights(self, content: str = "weights") -> NamedTensors:
        """Every rank: the tensors to push to the engines (`_sync_tensors`, on the CPU): the object-store
        path. Rank 0 returns them, the others an empty list."""
        tensors = self._sync_tensors(content)
        if self.rank != 0:
            for _ in tensors:  # take part in every gather
                pass
            return []
        return [(name, tensor.cpu().clone()) for name, tensor in tensors]

    # GPU weight paths: buckets of the parameters in the engines' dtype (bfloat16)

    def device_uuid(self) -> str | None:
        """The UUID of this rank's GPU (None on the CPU)."""
        from grpojob_trainer.weight_sync.buckets import device_uuid

        device = self.learner.device
        return device_uuid(device) if device.type == "cuda" else None

    def bucket_layouts(self, bucket_bytes: int, content: str = "weights") -> list[Any]:
        """How the tensors of ``content`` (`_sync_tensors`, full shapes) are packed into buckets (computed
        once per bucket size and content; a collective the first time, on every rank)."""
        from grpojob_trainer.weight_sync.buckets import plan_buckets

        key = (bucket_bytes, content)
        if key not in self._layouts:
            shapes = [(name, tuple(t.shape)) for name, t in self._sync_tensors(content)]
            self._layouts[key] = plan_buckets(shapes, bucket_bytes=bucket_bytes, dtype=torch.bfloat16)
        return self._layouts[key]

    def share_weights_ipc(self, bucket_bytes: int, content: str = "weights", share: bool = True) -> bytes | None:
        """Every rank (the gather is a collective); a rank that is to ``share`` (one with an engine on its GPU)
        packs the tensors of ``content`` into buckets on its GPU and shares them by CUDA IPC handles (kept
        alive until `release_shared_weights`): the payload `grpojob_trainer.weight_sync.buckets.open_shared_buckets`
        opens. The others return None.

        An adapter's buckets (a few hundred MB at most) are shared once and refilled at every push, under
        the same payload, so the engine opens them once (`vllm_extension`) rather than mapping new memory at
        every sync; full weights (GBs) get new buckets each time, freed once the engines have loaded them."""
        from grpojob_trainer.weight_sync.buckets import fill_bucket, share_buckets

        layouts = self.bucket_layouts(bucket_bytes, content)
        tensors = dict(self._sync_tensors(content))
        if not share:
            return None
        if content != SyncContent.ADAPTER:
            payload, self._shared = share_buckets(layouts, tensors, self.learner.device)
            return payload
        if bucket_bytes not in self._adapter_buckets:
            self._adapter_buckets[bucket_bytes] = share_buckets(layouts, tensors, self.learner.device)
            return self._adapter_buckets[bucket_bytes][0]
        payload, buckets = self._adapter_buckets[bucket_bytes]
        for layout, bucket in zip(layouts, buckets, strict=True):
            fill_bucket(layout, tensors, bucket)
        torch.cuda.synchronize(self.learner.device)
        return payload

    def release_shared_weights(self) -> None:
        self._shared = []

    def free_cached_memory(self) -> None:
        """Return the memory PyTorch's allocator caches (the last step's activations) to the GPU."""
        import gc

        import torch

        if self.learner.device.type == "cuda":
            gc.collect()
            torch.cuda.empty_cache()

    def weight_group_address(self) -> tuple[str, int]:
        """Rank 0: where the broadcast group's rendezvous will listen: this node's address and a free port."""
        return _free_address()

    def join_weight_group(self, host: str, port: int, world_size: int) -> None:
        """Rank 0: host the broadcast group's rendezvous and join it as its rank 0."""
        from grpojob_trainer.weight_sync.buckets import WeightBroadcastGroup

        self._group = WeightBroadcastGroup(host, port, world_size=world_size, rank=0, backend="nccl")

    def broadcast_weights(self, bucket_bytes: int, content: str = "weights") -> int:
        """Every rank (the gather is a collective); rank 0 broadcasts every bucket of ``content`` to the
        engines of the group (they receive concurrently). Bytes sent (0 on other ranks)."""
        layouts = self.bucket_layouts(bucket_bytes, content)
        tensors = dict(self._sync_tensors(content))
        if self.rank != 0:
            return 0
        return self._group.send_buckets(layouts, tensors, self.learner.device)

    def save(self, request: CheckpointRequest) -> list[WrittenCheckpoint]:
        """Every rank: gather the full state; rank 0 waits for the write before to finish, copies the state into
        host memory of its own and writes the checkpoint ``request`` asks for on its writer's thread, which then
        keeps the newest ``request.keep`` and that of ``request.kept_step``. Returns once the state is copied,
        before the write (`checkpoints_written` says when it is on disk), with the writes finished since the last
        report (rank 0's); raises the error of one that failed. A state whose copy would not fit the host memory
        left is written from the policy's own tensors, and this returns once it is written."""
        from grpojob_trainer.policy.checkpoint import snapshot_checkpoint

        # One snapshot in host memory at a time. The gather below is a collective: a failed write before this
        # one is raised only after it, or the other ranks would wait in it for rank 0 until their timeout.
        self.writer.wait()
        snapshot = snapshot_checkpoint(
            request.directory,
            step=request.step,
            model=self.learner.model,
            optimizer=self.learner.optimizer,
            data_position=request.data_position,
            config=request.config,
            keep=request.keep,
            kept_step=request.kept_step,
            base_model=self.model_path,
            host=self.checkpoint_host,  # free again: the write before has finished
        )
        written = self.writer.finished()
        if snapshot is not None:
            self.writer.start(snapshot)
            if snapshot.live:  # the policy's own tensors: written (or failed) before it trains on
                written += self.writer.finished(wait=True)
        return written

    def checkpoints_written(self, wait: bool = False) -> list[WrittenCheckpoint]:
        """Rank 0: the checkpoints written since the last call (``wait``: once the write in flight has finished);
        raises the error of a write that failed."""
        return self.writer.finished(wait)

    def export_checkpoint(self, checkpoint: str, out: str, dtype: str, output_format: str = "merged") -> str:
        """Rank 0: the model of ``checkpoint`` at ``out``, merged or (``output_format`` ``adapter``) as its
        adapter, with the tokenizer and config of the model the run started from. Its path."""
        from grpojob_trainer.policy.export import export_checkpoint

        adapter = output_format == api.OutputFormat.ADAPTER
        self.writer.wait()  # the checkpoint may be the one being written
        return str(export_checkpoint(checkpoint, out, base=self.model_path, dtype=dtype, adapter=adapter))

    def export(self, out: str, dtype: str, keep: int | None = None, output_format: str = "merged") -> str | None:
        """Every rank: gather the full model (a LoRA policy: its adapter); rank 0 writes it at ``out`` as a
        Hugging Face model directory (with the tokenizer and config of the model the run started from; a
        LoRA policy's adapter merged into it) or, for ``output_format`` ``adapter``, as a PEFT adapter
        directory; then, given ``keep``, keeps only the newest ``keep`` models exported with checkpoints
        beside it (here, because rank 0 is where the output volume is mounted). Its path on rank 0."""
        from grpojob_trainer.policy.export import prune_exports, write_adapter, write_merged_model, write_model
        from grpojob_trainer.policy.state import gather_model_state

        config = self.adapter_config()
        # A LoRA policy's merged model: merged on the policy's devices, layer by layer, unless its base is held
        # less precisely than the export asks for (a bf16 base exported as float32: merged from the files).
        live_merge = config is not None and output_format != api.OutputFormat.ADAPTER and self._base_holds(dtype)
        if config is None:
            state = gather_model_state(self.learner.model)
        elif live_merge:
            state = {name: tensor.cpu() for name, tensor in self._sync_tensors(SyncContent.MERGED)}
        else:
            state = {name: tensor.cpu() for name, tensor in self._sync_tensors(SyncContent.ADAPTER)}
        if self.rank != 0:
            return None
        if config is None or live_merge:
            written = write_model(state, out, base=self.model_path, dtype=dtype)
        elif output_format == api.OutputFormat.ADAPTER:
            written = write_adapter(state, config, out, base=self.model_path, dtype=dtype)
        else:
            written = write_merged_model(state, config, out, base=self.model_path, dtype=dtype)
        if keep is not None:
            prune_exports(written.parent, keep)
        return str(written)

    def _base_holds(self, dtype: str) -> bool:
        """Whether the policy's frozen weights are held at least as precisely as ``dtype``."""
        frozen = next((p for p in self.learner.model.parameters() if not p.requires_grad), None)
        return frozen is None or frozen.dtype == torch.float32 or dtype == "bfloat16"

    def resume(self, directory: str) -> tuple[int, dict[str, Any]] | None:
        """Every rank: load the newest complete checkpoint in ``directory`` (rank 0 first deletes what interrupted
        writes left there); (its step, its data position), or None."""
        from grpojob_trainer.policy.checkpoint import latest_checkpoint, load_checkpoint, remove_unfinished

        if self.rank == 0:
            remove_unfinished(directory)
        path = latest_checkpoint(directory) if Path(directory).exists() else None
        if path is None:
            return None
        info = load_checkpoint(path, model=self.learner.model, optimizer=self.learner.optimizer)
        return info.step, info.data_position
