"""The trainer's Ray actors: generation engines and the policy, each placed on its worker group.

A `generation` pod runs one `GenerationWorker` (an engine behind the OpenAI-compatible server on port
8000, which the `<job>-generation` Service selects); a `policy` pod runs the `PolicyWorker`. Placement
uses the custom Ray resources the RayCluster's groups declare (`{"generation": 1}`, `{"policy": 1}`);
`grpojob run` declares the same resources on its local Ray head. How weights travel policy → engines
(object store, CUDA IPC or NCCL broadcast) is `grpojob_trainer.weight_sync`'s choice; the actors here
offer each end of every path.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import torch

from grpojob_api import v1alpha1 as api
from grpojob_trainer.samples import TrainingSample

NamedTensors = list[tuple[str, torch.Tensor]]


class GenerationWorker:
    """One generation engine and its HTTP server (a Ray actor on a `generation` worker)."""

    def __init__(self, spec: dict[str, Any], model_path: str, host: str, port: int | None, seed: int) -> None:
        from grpojob_trainer.generation.app import ServerConfig
        from grpojob_trainer.generation.backend import GenerationBackend, SamplingParams
        from grpojob_trainer.generation.server import GenerationServer
        from grpojob_trainer.generation.transformers_backend import TransformersBackend

        job_spec = api.GRPOJobSpec.model_validate(spec)
        generation = job_spec.generation
        backend: GenerationBackend
        if generation.backend == api.GenerationBackend.VLLM:
            from grpojob_trainer.generation.vllm_backend import VLLMBackend

            backend = VLLMBackend(
                model_path,
                max_model_len=generation.max_model_len,
                gpu_memory_utilization=generation.gpu_memory_utilization,
                tensor_parallel_size=max(1, generation.gpus_per_replica),
                seed=seed,
            )
        else:
            backend = TransformersBackend(model_path, max_model_len=generation.max_model_len, seed=seed)
        config = ServerConfig(
            served_model_name=job_spec.model.served_model_name,
            sampling=SamplingParams(generation.temperature, generation.top_p, generation.max_new_tokens),
        )
        self.server = GenerationServer(backend, config, host=host, port=port).start()

    def base_url(self) -> str:
        return self.server.base_url

    def weight_sync_info(self) -> dict[str, Any]:
        """Which weight paths this engine offers: its backend and, for vLLM, its GPUs' UUIDs."""
        from grpojob_trainer.generation.vllm_backend import VLLMBackend

        backend = self.server.backend
        if isinstance(backend, VLLMBackend):
            return {"backend": "vllm", "device_uuids": backend.device_uuids()}
        return {"backend": "transformers", "device_uuids": []}

    def update_weights(self, named_tensors: NamedTensors) -> int:
        return self.server.update_weights(named_tensors)

    def update_weights_ipc(self, payload: bytes) -> int:
        return self.server.backend.update_weights_ipc(payload)

    def join_weight_group(self, host: str, port: int, world_size: int, rank: int) -> None:
        self.server.backend.join_weight_group(host, port, world_size, rank)

    def update_weights_from_group(self, layouts_payload: bytes) -> int:
        return self.server.backend.update_weights_from_group(layouts_payload)

    def stop(self) -> None:
        self.server.stop()


class PolicyWorker:
    """The policy being trained, its optimizer and its checkpoints (a Ray actor on a `policy` worker)."""

    def __init__(self, spec: dict[str, Any], model_path: str, seed: int) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from grpojob_trainer.policy import PolicyTrainer

        torch.manual_seed(seed)
        self.spec = api.GRPOJobSpec.model_validate(spec)
        tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, local_files_only=True)
        if torch.cuda.is_available():  # the GPUs Ray gave this actor (none on a CPU worker)
            model.to("cuda")
        if self.spec.training.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.trainer = PolicyTrainer.from_spec(model, self.spec, pad_token_id=pad)
        self._shared: list[torch.Tensor] = []
        self._group: Any = None
        self._layouts: dict[int, list[Any]] = {}

    def train_step(self, samples: list[TrainingSample]) -> dict[str, float]:
        return self.trainer.train_step(samples)

    def weights(self) -> NamedTensors:
        """The parameters to push to the engines (detached copies on the CPU): the object-store path."""
        return [(name, tensor.detach().cpu().clone()) for name, tensor in self.trainer.model.state_dict().items()]

    # GPU weight paths: buckets of the parameters in the engines' dtype (bfloat16)

    def device_uuid(self) -> str | None:
        """The UUID of the policy's GPU (None on the CPU)."""
        from grpojob_trainer.weights import device_uuid

        device = self.trainer.device
        return device_uuid(device) if device.type == "cuda" else None

    def bucket_layouts(self, bucket_bytes: int) -> list[Any]:
        """How the parameters are packed into buckets (computed once per bucket size)."""
        from grpojob_trainer.weights import plan_buckets, trainable_weights

        if bucket_bytes not in self._layouts:
            shapes = [(name, tuple(t.shape)) for name, t in trainable_weights(self.trainer.model)]
            self._layouts[bucket_bytes] = plan_buckets(shapes, bucket_bytes=bucket_bytes, dtype=torch.bfloat16)
        return self._layouts[bucket_bytes]

    def share_weights_ipc(self, bucket_bytes: int) -> bytes:
        """Pack the parameters into buckets on the GPU and share them by CUDA IPC handles (kept alive until
        `release_shared_weights`); the payload `grpojob_trainer.weights.open_shared_buckets` opens."""
        from grpojob_trainer.weights import share_buckets, trainable_weights

        tensors = dict(trainable_weights(self.trainer.model))
        payload, self._shared = share_buckets(self.bucket_layouts(bucket_bytes), tensors, self.trainer.device)
        return payload

    def release_shared_weights(self) -> None:
        self._shared = []

    def weight_group_address(self) -> tuple[str, int]:
        """Where the broadcast group's rendezvous will listen: this node's address and a free port."""
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def join_weight_group(self, host: str, port: int, world_size: int) -> None:
        """Host the broadcast group's rendezvous and join it as rank 0."""
        from grpojob_trainer.weights import WeightBroadcastGroup

        self._group = WeightBroadcastGroup(host, port, world_size=world_size, rank=0, backend="nccl")

    def broadcast_weights(self, bucket_bytes: int) -> int:
        """Broadcast every bucket to the engines of the group (they receive concurrently); bytes sent."""
        from grpojob_trainer.weights import trainable_weights

        tensors = dict(trainable_weights(self.trainer.model))
        return self._group.send_buckets(self.bucket_layouts(bucket_bytes), tensors, self.trainer.device)

    def save(self, directory: str, step: int, data_position: dict[str, Any], config: dict[str, Any], keep: int) -> str:
        from grpojob_trainer.checkpoint import save_checkpoint

        path = save_checkpoint(
            directory,
            step=step,
            model=self.trainer.model,
            optimizer=self.trainer.optimizer,
            data_position=data_position,
            config=config,
            keep=keep,
        )
        return str(path)

    def resume(self, directory: str) -> tuple[int, dict[str, Any]] | None:
        """Load the newest checkpoint in ``directory``; (its step, its data position), or None."""
        from grpojob_trainer.checkpoint import latest_checkpoint, load_checkpoint

        path = latest_checkpoint(directory) if Path(directory).exists() else None
        if path is None:
            return None
        info = load_checkpoint(path, model=self.trainer.model, optimizer=self.trainer.optimizer)
        return info.step, info.data_position
