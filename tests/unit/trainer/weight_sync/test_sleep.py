"""An engine that shares the policy's GPU sleeps while the policy trains (``spec.generation.sleepWhileTraining``):
`CudaIpcSync.release` puts it to sleep, and the next `push` gives the GPU back in an order that fits: the
policy's cached memory first, then the engine's weights, the new weights loaded, the policy's shared buckets
freed, and only then the engine's KV cache.

vLLM's sleep mode needs a GPU (tests/gpu exercises it through `grpojob run`); here Ray actors stand in for the
engines and record, with the policy, every call in one journal, in the order they happened."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from grpojob_trainer.weight_sync.paths import ADAPTER, WEIGHTS, Content, CudaIpcSync, sleep_level

FREE_WHILE_ASLEEP = 100 * 2**30


@pytest.fixture(scope="module")
def ray_journal(own_ray_token: str) -> Iterator[Any]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")

    @ray.remote
    class Journal:
        def __init__(self) -> None:
            self.entries: list[str] = []

        def write(self, entry: str) -> None:
            self.entries.append(entry)

        def read(self) -> list[str]:
            entries, self.entries = self.entries, []
            return entries

    try:
        yield Journal.remote()
    finally:
        ray.shutdown()


def engines(journal: Any, count: int) -> list[Any]:
    import ray

    @ray.remote
    class SleepingEngine:
        def __init__(self, name: str) -> None:
            self.name, self.version = name, 0

        def _write(self, entry: str) -> None:
            ray.get(journal.write.remote(f"{self.name} {entry}"))

        def sleep(self, level: int) -> int:
            self._write(f"sleep level {level}")
            return FREE_WHILE_ASLEEP

        def wake_up(self, tags: list[str]) -> None:
            self._write(f"wake {' '.join(tags)}")

        def update_weights_ipc(self, payload: bytes) -> int:
            self._write(f"load {payload.decode()}")
            self.version += 1
            return self.version

        def update_adapter_ipc(self, config: dict[str, Any], payload: bytes) -> int:
            self._write(f"load adapter {payload.decode()}")
            self.version += 1
            return self.version

    return [SleepingEngine.remote(f"engine{i}") for i in range(count)]


class Policy:
    """The driver's side of the policy's ranks, writing what it is asked to the journal."""

    def __init__(self, journal: Any) -> None:
        self.journal = journal

    def _write(self, entry: str) -> None:
        import ray

        ray.get(self.journal.write.remote(f"policy {entry}"))

    def share_weights_ipc(self, bucket_bytes: int, content: str, sharing: set[int]) -> list[Any]:
        import ray

        self._write(f"share {content}")
        return [ray.put(b"buckets")]

    def release_shared_weights(self) -> None:
        self._write("release buckets")

    def free_cached_memory(self) -> None:
        self._write("free cached memory")


def journal_of(journal: Any) -> list[str]:
    import ray

    return ray.get(journal.read.remote())


def test_sleeping_engines_are_woken_for_the_weights_after_the_policy_frees_its_memory(ray_journal: Any):
    sync = CudaIpcSync(Policy(ray_journal), engines(ray_journal, 1), sleep=True)  # type: ignore[arg-type]

    released = sync.release()
    asleep = journal_of(ray_journal)
    pushed = sync.push()

    assert asleep == ["engine0 sleep level 2"]
    assert released["weight_sync/free_gib_while_training"] == 100
    assert released["weight_sync/sleep_seconds"] >= 0
    assert journal_of(ray_journal) == [
        "policy free cached memory",
        "engine0 wake weights",
        "policy share weights",
        "engine0 load buckets",
        "policy release buckets",
        "policy free cached memory",
        "engine0 wake kv_cache",
    ]
    assert pushed["weight_sync/version"] == 1


def test_every_engine_sleeps_and_wakes_and_a_push_without_a_sleep_wakes_nothing(ray_journal: Any):
    sync = CudaIpcSync(Policy(ray_journal), engines(ray_journal, 2), sleep=True)  # type: ignore[arg-type]

    sync.release()
    assert sync.release() == {}  # already asleep
    sync.push()
    woken = journal_of(ray_journal)
    sync.push()

    assert sorted(e for e in woken if e.startswith("engine")) == [
        "engine0 load buckets",
        "engine0 sleep level 2",
        "engine0 wake kv_cache",
        "engine0 wake weights",
        "engine1 load buckets",
        "engine1 sleep level 2",
        "engine1 wake kv_cache",
        "engine1 wake weights",
    ]
    awake = journal_of(ray_journal)
    loads = sorted(entry for entry in awake if entry.startswith("engine"))
    assert loads == ["engine0 load buckets", "engine1 load buckets"]
    assert not [entry for entry in awake if "wake" in entry or "free" in entry]


def test_engines_that_cannot_sleep_keep_their_memory(ray_journal: Any):
    sync = CudaIpcSync(Policy(ray_journal), engines(ray_journal, 1), sleep=False)  # type: ignore[arg-type]

    assert sync.release() == {}
    sync.push()

    assert not [entry for entry in journal_of(ray_journal) if "sleep" in entry or "wake" in entry]


def test_an_adapters_engine_keeps_its_base_in_host_memory_while_asleep(ray_journal: Any):
    config = {"r": 8, "lora_alpha": 16}
    policy = Policy(ray_journal)
    sync = CudaIpcSync(policy, engines(ray_journal, 1), content=Content(ADAPTER, config), sleep=True)  # type: ignore[arg-type]

    sync.release()
    sync.push()

    entries = journal_of(ray_journal)
    assert entries[0] == "engine0 sleep level 1"
    assert "engine0 load adapter buckets" in entries
    assert "policy release buckets" not in entries, "an adapter's buckets are kept for the next push"
    assert [sleep_level(WEIGHTS), sleep_level(ADAPTER)] == [2, 1]


@pytest.mark.parametrize(
    ("training", "asked", "shares_gpu", "sleeps"),
    [
        ({}, None, True, True),  # full weights replace the engine's own: dropping them costs nothing
        ({"lora": {"rank": 8}}, None, True, False),  # the base would go to host memory and back every step
        ({"lora": {"rank": 8}}, True, True, True),
        ({}, False, True, False),
        ({}, True, False, False),  # an engine with a GPU of its own keeps it
    ],
)
def test_whether_an_engine_sleeps_while_the_policy_trains(
    training: dict, asked: bool | None, shares_gpu: bool, sleeps: bool
):
    from grpojob_api.admission import parse_job

    generation = {"backend": "vllm", "maxModelLen": 512, "maxNewTokens": 64}
    if asked is not None:
        generation["sleepWhileTraining"] = asked
    spec = {
        "model": {"path": "/models/tiny"},
        "dataset": {"path": "rows.jsonl"},
        "environments": [{"name": "arith"}],
        "generation": generation,
        "training": training,
    }
    job = parse_job({"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "demo"}, "spec": spec})

    assert job.spec.engine_sleeps(shares_gpu) is sleeps
