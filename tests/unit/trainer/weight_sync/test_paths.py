"""Which path the policy's weights take to the engines, decided from where the actors are."""

from grpojob_trainer.weight_sync.paths import choose_path


def vllm(*uuids: str) -> dict:
    return {"backend": "vllm", "device_uuids": list(uuids)}


def test_a_cpu_policy_sends_through_the_object_store():
    assert choose_path(None, [vllm("GPU-a")]) == "object-store"


def test_the_transformers_engine_takes_tensors_through_the_object_store():
    assert choose_path("GPU-a", [{"backend": "transformers", "device_uuids": []}]) == "object-store"


def test_engines_on_the_policy_gpu_open_its_buckets_by_cuda_ipc():
    assert choose_path("GPU-a", [vllm("GPU-a"), vllm("GPU-a")]) == "cuda-ipc"


def test_engines_on_other_gpus_receive_an_nccl_broadcast():
    assert choose_path("GPU-a", [vllm("GPU-b"), vllm("GPU-c")]) == "nccl-broadcast"


def test_mixed_or_tensor_parallel_layouts_fall_back_to_the_object_store():
    assert choose_path("GPU-a", [vllm("GPU-a"), vllm("GPU-b")]) == "object-store"
    assert choose_path("GPU-a", [vllm("GPU-b", "GPU-c")]) == "object-store"
