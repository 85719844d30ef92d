"""GRPOJobs applied with kubectl to a real node with a real GPU (`make e2e-gpu`): the helm-installed operator
makes the RayCluster, KubeRay starts its pods from the image made of the machine itself
(`grpojob_testing.host_image`), our device plugin hands the worker pod the GPU, and the job trains to
`Succeeded` with its reward rising, its STEP and REWARD in `kubectl get grpojobs` while it trains, vLLM seen
on the GPU from inside the worker pod, and the exported model on the claim loadable by vLLM.

The cluster: ``GRPOJOB_TEST_KUBECONFIG`` when set (benchmarks/device/e2e-gpu.sh starts it once, with
`python -m grpojob_testing.gpu_cluster up`, and its processes outlive each command); otherwise this module
starts one (`grpojob_testing.gpu_cluster`) and stops it at the end. Every test skips, saying why, without a
GPU, vLLM and Ray, root, or the node's packages."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from grpojob_testing.gpu_jobs import Kube, data_claim, grpo_job

REPO = Path(__file__).resolve().parents[2]
GPUS = sorted(Path("/dev").glob("nvidia[0-9]*"))
TERMINAL = {"Succeeded", "Failed"}

pytestmark = [
    pytest.mark.skipif(not GPUS, reason="needs an NVIDIA GPU (/dev/nvidia0; runs on the GPU machine)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (installed on the GPU machine)"),
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs Ray (installed on the GPU machine)"),
    pytest.mark.timeout(1800),
]


@pytest.fixture(scope="module")
def kube() -> Iterator[Kube]:
    existing = os.environ.get("GRPOJOB_TEST_KUBECONFIG")
    if existing:
        yield Kube(Path(existing))
        return
    if os.geteuid() != 0:
        pytest.skip("a real GPU node needs root")
    from grpojob_testing import gpu_cluster, node

    try:
        node.preflight()
    except RuntimeError as error:
        pytest.skip(f"{error} (make node-packages)")
    kubeconfig = gpu_cluster.up()
    try:
        yield Kube(kubeconfig)
    finally:
        gpu_cluster.down()


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"{re.sub(r'[^a-z0-9]+', '-', request.node.name.lower())[:40].strip('-')}-{uuid.uuid4().hex[:6]}"
    kube.run("create", "namespace", name)
    yield name
    kube.run("delete", "namespace", name, "--wait=false", check=False)


@dataclass
class Seen:
    """What polling the job saw: (step, mean reward) from its status, `kubectl get` rows, its phases."""

    rewards: dict[int, float] = field(default_factory=dict)
    get_rows: list[dict[str, str]] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)
    gpu_from_pod: str = ""
    engine_log: str = ""
    worker_groups: list[str] = field(default_factory=list)


def worker_pod(kube: Kube, namespace: str, job: str, group: str) -> str | None:
    pods = kube.json("get", "pods", "-n", namespace, "-l", f"ray.io/cluster={job},ray.io/group={group}")["items"]
    running = [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"]
    return running[0] if running else None


def look_inside_the_worker(kube: Kube, namespace: str, pod: str, seen: Seen) -> None:
    """nvidia-smi from the worker pod itself (the device plugin's mount), and vLLM's own log lines there."""
    if "MiB" not in seen.gpu_from_pod:
        seen.gpu_from_pod = kube.run(
            "exec", "-n", namespace, pod, "--", "/usr/local/nvidia/bin/nvidia-smi",
            "--query-gpu=name,memory.used", "--format=csv,noheader", check=False,
        )  # fmt: skip
    if "Model loading took" not in seen.engine_log:
        seen.engine_log = kube.run(
            "exec", "-n", namespace, pod, "--", "sh", "-c",
            "grep -rhE 'Model loading took|Loading weights took|KV cache' /tmp/ray/session_latest/logs | head -5",
            check=False,
        )  # fmt: skip


STARTUP_TIMEOUT_S = 300
"""A job still Initializing this long after it was applied (image present) is stuck: fail with what shows why,
rather than wait out the whole timeout on a GPU machine lent by the half hour."""


def why_it_is_stuck(kube: Kube, namespace: str, name: str) -> str:
    """The job's pods, their warnings, and the Ray head's own logs of its dashboard agent (what KubeRay probes)."""
    pods = kube.run("get", "pods", "-n", namespace, "-o", "wide", check=False)
    events = kube.run("get", "events", "-n", namespace, "--field-selector=type=Warning", check=False)
    head = kube.run("get", "pods", "-n", namespace, "-l", f"ray.io/cluster={name},ray.io/node-type=head", "-o", "name")
    agent = kube.run(
        "exec", "-n", namespace, head.strip(), "--", "sh", "-c",
        "cd /tmp/ray/session_latest/logs && tail -n 20 dashboard_agent.log raylet.err",
        check=False,
    ) if head.strip() else ""  # fmt: skip
    return f"pods:\n{pods}\nwarnings:\n{events[-3000:]}\nthe Ray head's dashboard agent:\n{agent[-3000:]}"


def what_the_job_logged(kube: Kube, namespace: str, name: str) -> str:
    """The end of the trainer's log (its latest attempt: the operator deletes an attempt's Job before the next, and
    keeps each attempt's reason in the job's events) and the Ray pods' error lines (an engine's or a policy rank's
    own traceback goes there), taken before the test's namespace, and the pods with it, are deleted."""
    trainers = kube.run(
        "logs", "-n", namespace, "-l", f"job-name={name}-trainer", "--tail=40", "--prefix", "--max-log-requests=10",
        check=False,
    )  # fmt: skip
    workers = []
    for pod in kube.run("get", "pods", "-n", namespace, "-l", f"ray.io/cluster={name}", "-o", "name").split():
        errors = kube.run(
            "exec", "-n", namespace, pod.removeprefix("pod/"), "--", "sh", "-c",
            "cd /tmp/ray/session_latest/logs && grep -hE '(Error|Exception|Killed|OOM)' "
            "worker-*.err worker-*.out raylet.out 2>/dev/null | tail -n 30",
            check=False,
        )  # fmt: skip
        workers.append(f"{pod}:\n{errors}")
    return f"the trainer's attempts:\n{trainers[-6000:]}\nthe Ray pods' errors:\n" + "\n".join(workers)[-6000:]


def watch(kube: Kube, namespace: str, name: str, group: str, timeout: float) -> Seen:
    """Poll the job to a terminal phase, recording its progress and, while it runs, the worker pod's view."""
    seen = Seen()
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        status = kube.json("get", "grpojob", name, "-n", namespace).get("status") or {}
        if status.get("phase") and (not seen.phases or seen.phases[-1] != status["phase"]):
            seen.phases.append(status["phase"])
        if status.get("step") is not None and status.get("meanReward") is not None:
            seen.rewards[status["step"]] = status["meanReward"]
        table = kube.run("get", "grpojobs", name, "-n", namespace).splitlines()
        if len(table) == 2:
            seen.get_rows.append(dict(zip(table[0].split(), table[1].split(), strict=False)))
        if not seen.worker_groups:
            raycluster = json.loads(
                kube.run("get", "raycluster", name, "-n", namespace, "-o", "json", check=False) or "{}"
            )
            seen.worker_groups = sorted(g["groupName"] for g in raycluster.get("spec", {}).get("workerGroupSpecs", []))
        if status.get("phase") == "Running" and (pod := worker_pod(kube, namespace, name, group)):
            look_inside_the_worker(kube, namespace, pod, seen)
        if status.get("phase") in TERMINAL:
            return seen
        if status.get("phase") in (None, "Initializing") and time.monotonic() - started > STARTUP_TIMEOUT_S:
            pytest.fail(
                f"GRPOJob {namespace}/{name} still Initializing after {STARTUP_TIMEOUT_S}s\n"
                + why_it_is_stuck(kube, namespace, name)
                + what_the_job_logged(kube, namespace, name)
            )
        time.sleep(2)
    pytest.fail(f"GRPOJob {namespace}/{name} did not finish in {timeout:.0f}s: {seen}")


def assert_the_reward_rose(rewards: dict[int, float]) -> None:
    curve = [rewards[step] for step in sorted(rewards)]
    assert len(curve) >= 6, f"too few steps seen: {curve}"
    first, last = sum(curve[:3]) / 3, sum(curve[-3:]) / 3
    assert last > first + 0.05, f"reward did not rise: {curve}"


def assert_vllm_loads(directory: Path, lora: Path | None = None) -> None:
    """vLLM (in a process of its own: the GPU is free once the job is done) generates from the exported model."""
    script = f"""
from vllm import LLM, SamplingParams
from vllm.lora.request import LoRARequest
llm = LLM(model={str(directory)!r}, max_model_len=512, gpu_memory_utilization=0.5, enforce_eager=True,
          enable_lora={lora is not None}, max_lora_rank=64)
lora = LoRARequest("exported", 1, {str(lora)!r}) if {lora is not None} else None
out = llm.generate(["2+2="], SamplingParams(max_tokens=8, temperature=0), lora_request=lora)[0]
print("generated", len(out.outputs[0].token_ids), "tokens")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "generated" in done.stdout, done.stdout[-2000:] + done.stderr[-4000:]


def run_job(kube: Kube, namespace: str, job: dict[str, Any], group: str, timeout: float) -> Seen:
    name = job["metadata"]["name"]
    # --validate=strict: a field the CRD does not know fails here instead of being pruned away.
    kube.run("apply", "--validate=strict", "-n", namespace, "-f", "-", stdin=json.dumps(job))
    seen = watch(kube, namespace, name, group, timeout)
    status = kube.json("get", "grpojob", name, "-n", namespace)["status"]
    print(f"{name}: phases {seen.phases}; rewards {seen.rewards}")
    print(f"kubectl get grpojobs while training: {seen.get_rows[len(seen.get_rows) // 2] if seen.get_rows else None}")
    print(
        f"nvidia-smi in the worker pod: {seen.gpu_from_pod.strip()}\nvLLM in the worker pod: {seen.engine_log.strip()}"
    )
    if status["phase"] != "Succeeded":
        pytest.fail(json.dumps(status, indent=2) + "\n" + what_the_job_logged(kube, namespace, name))
    return seen


def assert_progress_was_visible(seen: Seen) -> None:
    training = [row for row in seen.get_rows if row.get("STEP", "<none>") not in ("<none>", "0")]
    assert training and all(row.get("REWARD", "<none>") != "<none>" for row in training), seen.get_rows[-5:]


def assert_vllm_ran_on_the_gpu_in_the_pod(seen: Seen) -> None:
    assert re.search(r"NVIDIA .*, [1-9]\d{3,} MiB", seen.gpu_from_pod), f"nvidia-smi in the pod: {seen.gpu_from_pod!r}"
    assert "Model loading took" in seen.engine_log or "KV cache" in seen.engine_log, seen.engine_log


def test_a_colocated_full_fine_tune_of_the_1_5b_shape_succeeds_on_the_gpu(kube: Kube, namespace: str):
    steps = 16
    host_dir = data_claim(kube, namespace, "qwen2.5-1.5b", rows=32 * (steps + 2))
    try:
        # Room for the checkpoint's copy of the fp32 parameters and AdamW moments (18 GB for 1.5B) beside the engine
        # and the policy, which the default 24Gi a GPU has not (its checkpoint would be written from the GPU).
        job = grpo_job("full-1-5b", steps=steps, learning_rate=5e-5, placement="colocated", memory="48Gi")
        seen = run_job(kube, namespace, job, group="colocated", timeout=1500)
        assert seen.worker_groups == ["colocated"], "one group: each GPU holds an engine and a policy rank"
        assert_progress_was_visible(seen)
        assert_vllm_ran_on_the_gpu_in_the_pod(seen)
        assert_the_reward_rose(seen.rewards)
        assert_vllm_loads(host_dir / "models" / "full-1-5b" / "final")
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)


def test_a_colocated_lora_job_of_the_7b_shape_succeeds_on_the_gpu(kube: Kube, namespace: str):
    steps = 12  # the 7B model is written, served, trained and loaded again within one device call's 10 minutes
    host_dir = data_claim(kube, namespace, "qwen2.5-7b", rows=32 * (steps + 2))
    try:
        # The 7B base is 15 GB in bfloat16, read by the policy and by the engine in the same pod.
        job = grpo_job("lora-7b", steps=steps, learning_rate=5e-4, placement="colocated", lora_rank=16, memory="64Gi")
        seen = run_job(kube, namespace, job, group="colocated", timeout=1500)
        assert seen.worker_groups == ["colocated"]
        assert_progress_was_visible(seen)
        assert_vllm_ran_on_the_gpu_in_the_pod(seen)
        assert_the_reward_rose(seen.rewards)
        adapter = host_dir / "models" / "lora-7b" / "final"
        assert (adapter / "adapter_config.json").exists()
        assert_vllm_loads(host_dir / "model", lora=adapter)
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)


@pytest.mark.skipif(len(GPUS) < 2, reason="the split layout needs two GPUs (engine on one, policy on the other)")
def test_a_split_job_puts_the_engine_and_the_policy_on_their_own_gpus(kube: Kube, namespace: str):
    steps = 6
    host_dir = data_claim(kube, namespace, "qwen2.5-1.5b", rows=32 * (steps + 2))
    try:
        job = grpo_job("split-1-5b", steps=steps, learning_rate=1e-5, placement="split")
        seen = run_job(kube, namespace, job, group="generation", timeout=1500)
        assert seen.worker_groups == ["generation", "policy"]
        assert_progress_was_visible(seen)
        assert_vllm_ran_on_the_gpu_in_the_pod(seen)
        assert_vllm_loads(host_dir / "models" / "split-1-5b" / "final")
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
