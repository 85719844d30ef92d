"""Which path the policy's weights take to the engines, decided from where the actors are."""

from grpojob_trainer.weight_sync.paths import ADAPTER, MERGED, WEIGHTS, choose_content, choose_path, ipc_sources


def vllm(*uuids: str) -> dict:
    return {"backend": "vllm", "device_uuids": list(uuids)}


def test_a_cpu_policy_sends_through_the_object_store():
    assert choose_path([None], [vllm("GPU-a")]) == "object-store"


def test_the_transformers_engine_takes_tensors_through_the_object_store():
    assert choose_path(["GPU-a"], [{"backend": "transformers", "device_uuids": []}]) == "object-store"


def test_engines_on_the_policy_gpu_open_its_buckets_by_cuda_ipc():
    assert choose_path(["GPU-a"], [vllm("GPU-a"), vllm("GPU-a")]) == "cuda-ipc"


def test_engines_on_other_gpus_receive_an_nccl_broadcast():
    assert choose_path(["GPU-a"], [vllm("GPU-b"), vllm("GPU-c")]) == "nccl-broadcast"


def test_colocated_engines_each_open_the_buckets_of_the_rank_on_their_gpu():
    policy_gpus: list[str | None] = ["GPU-a", "GPU-b", "GPU-c"]
    engines = [vllm("GPU-c"), vllm("GPU-a"), vllm("GPU-b")]
    assert choose_path(policy_gpus, engines) == "cuda-ipc"
    assert ipc_sources(policy_gpus, engines) == [2, 0, 1]


def test_engines_off_every_rank_gpu_receive_the_broadcast_and_a_mix_falls_back():
    assert choose_path(["GPU-a", "GPU-b"], [vllm("GPU-c")]) == "nccl-broadcast"
    assert choose_path(["GPU-a", "GPU-b"], [vllm("GPU-b"), vllm("GPU-c")]) == "object-store"
    assert ipc_sources(["GPU-a", "GPU-b"], [vllm("GPU-b"), vllm("GPU-c")]) is None


def test_mixed_or_tensor_parallel_layouts_fall_back_to_the_object_store():
    assert choose_path(["GPU-a"], [vllm("GPU-a"), vllm("GPU-b")]) == "object-store"
    assert choose_path(["GPU-a"], [vllm("GPU-b", "GPU-c")]) == "object-store"


def test_a_full_fine_tune_sends_every_weight():
    assert choose_content(False, [vllm("GPU-a") | {"lora": True}]) == WEIGHTS


def test_a_lora_policy_sends_its_adapter_alone_when_every_engine_serves_lora():
    engines = [vllm("GPU-a") | {"lora": True}, {"backend": "transformers", "device_uuids": [], "lora": True}]
    assert choose_content(True, engines) == ADAPTER


def test_a_lora_policy_sends_merged_weights_when_an_engine_cannot_serve_lora():
    assert choose_content(True, [vllm("GPU-a") | {"lora": True}, vllm("GPU-b") | {"lora": False}]) == MERGED


def test_engines_are_started_with_the_smallest_lora_rank_vllm_accepts_that_holds_the_adapter():
    from grpojob_trainer.generation.vllm_backend import lora_engine_args, max_lora_rank

    assert [max_lora_rank(r) for r in (1, 2, 8, 9, 300, 512)] == [1, 8, 8, 16, 320, 512]
    assert lora_engine_args(None) == {}
    assert lora_engine_args(20) == {"enable_lora": True, "max_lora_rank": 32, "max_loras": 2, "max_cpu_loras": 3}
