"""A GRPOJob on machines that may be taken back (spot GPUs): its trainer pod deleted mid-step, as a node drain or
a reclaim's notice does, stops at its last completed step, checkpoints it within its grace period and resumes at
the next step, every step trained once on the prompts of the dataset's order; a Ray worker pod deleted mid-step
ends the attempt within seconds saying which worker was lost, and the retry waits for the worker's replacement
and resumes from the last checkpoint. Neither counts against `spec.backoffLimit` (0 here): both are preemptions,
and the job succeeds."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from kubernetes import client

from grpojob_operator import names
from tests.e2e.test_grpojob import GROUP, PLURAL, TERMINAL, VERSION, run_pod, tiny_job, watch_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

STEPS = 12
PROMPTS_PER_STEP = 8
"""`tiny_job`'s: with 256 rows, every step of the job draws the next 8 of epoch 0."""


def trained_steps(
    core: client.CoreV1Api, namespace: str, job: str, claim: str
) -> dict[int, list[tuple[int, int, int]]]:
    """Attempt → (step, data epoch, data index) of each step it trained, from its `metrics.jsonl` on the claim."""
    script = f'for f in /data/logs/{job}/attempt-*/metrics.jsonl; do echo "== $f"; cat "$f"; done'
    attempts: dict[int, list[tuple[int, int, int]]] = {}
    attempt = 0
    for line in run_pod(core, namespace, f"read-{job}", claim, script).splitlines():
        if line.startswith("== "):
            attempt = int(re.search(r"attempt-(\d+)/", line).group(1))
            attempts[attempt] = []
        elif line.strip() and "data/index" in (record := json.loads(line)):
            attempts[attempt].append((record["step"], record["data/epoch"], record["data/index"]))
    return attempts


def dataset_order(steps: int) -> list[tuple[int, int, int]]:
    """What an uninterrupted run trains: step s on the prompts that end at s x 8 in epoch 0."""
    return [(step, 0, step * PROMPTS_PER_STEP) for step in range(1, steps + 1)]


def events(core: client.CoreV1Api, namespace: str, job: str, reason: str) -> list[str]:
    found = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={job},reason={reason}")
    return [event.message for event in found.items]


def run_until_step(api_client, namespace: str, name: str, claim: str, interval: int, step: int) -> float:
    """Create the job, checkpointing every ``interval`` steps, with ``backoffLimit: 0`` (one counted failure
    would fail it); return once its status shows ``step``."""
    manifest = tiny_job(name, claim, STEPS, backoff_limit=0)
    manifest["spec"]["checkpointing"] = {"interval": interval, "pvc": {"claimName": claim}, "gracePeriodSeconds": 120}
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    started = time.monotonic()
    watched = watch_job(api_client, namespace, name, 900, until=lambda s: (s.get("step") or 0) >= step)
    assert watched.status["attempt"] == 1, watched.status
    return started


def finish(api_client, namespace: str, name: str) -> dict[str, Any]:
    watched = watch_job(api_client, namespace, name, 1200)
    status = watched.status
    assert (status["phase"], status["attempt"], status["step"]) == ("Succeeded", 2, STEPS), status
    assert (status.get("preemptions"), status.get("reason")) == (1, "Completed"), status
    return status


def test_a_trainer_pod_deleted_mid_step_resumes_at_the_next_step_and_trains_every_step_once(
    api_client, namespace, grpo_data
):
    core = client.CoreV1Api(api_client)
    # No checkpoint but the stop's: the retry can only go on from the step the stop saved.
    started = run_until_step(api_client, namespace, "spot-trainer", grpo_data, interval=100, step=3)
    selector = f"{names.JOB_LABEL}=spot-trainer,{names.COMPONENT_LABEL}=trainer,{names.ATTEMPT_LABEL}=1"
    (pod,) = core.list_namespaced_pod(namespace, label_selector=selector).items
    core.delete_namespaced_pod(pod.metadata.name, namespace)  # SIGTERM, then the pod's grace period

    status = finish(api_client, namespace, "spot-trainer")
    print(f"GRPOJob spot-trainer: {status['phase']} in {time.monotonic() - started:.0f}s")
    (preempted,) = events(core, namespace, "spot-trainer", "TrainerPreempted")
    attempts = trained_steps(core, namespace, "spot-trainer", grpo_data)
    stopped = attempts[1][-1][0]
    assert 3 <= stopped < STEPS and attempts[2][0][0] == stopped + 1, f"attempt 2 went on from step {stopped}"
    said = re.search(r"preempted at step (\d+); checkpoint \S+/step_0*(\d+)", preempted)
    # From its pod's termination message or, the pod deleted with it, from the trainer's report beside its progress.
    assert said and said.groups() == (str(stopped), str(stopped)), preempted
    assert attempts[1] + attempts[2] == dataset_order(STEPS), "each step once, none skipped, in the dataset's order"
    custom = client.CustomObjectsApi(api_client)
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "spot-trainer")


def test_a_ray_worker_pod_deleted_mid_step_ends_the_attempt_and_the_retry_resumes_from_the_checkpoint(
    api_client, namespace, grpo_data
):
    core = client.CoreV1Api(api_client)
    started = run_until_step(api_client, namespace, "spot-worker", grpo_data, interval=4, step=5)
    selector = "ray.io/cluster=spot-worker,ray.io/node-type=worker"  # on the CPU: one pod, a rank beside an engine
    (pod,) = core.list_namespaced_pod(namespace, label_selector=selector).items
    core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)  # its machine reclaimed
    deleted = time.monotonic()

    retried = watch_job(
        api_client,
        namespace,
        "spot-worker",
        300,
        until=lambda s: s.get("attempt", 1) >= 2 or s.get("phase") in TERMINAL,
    )
    assert retried.status["attempt"] == 2, f"attempt 1 went on as if its worker had not been lost: {retried.status}"
    noticed = time.monotonic() - deleted
    status = finish(api_client, namespace, "spot-worker")
    took = time.monotonic() - started
    print(f"GRPOJob spot-worker: attempt 2 {noticed:.0f}s after the deletion, {status['phase']} at {took:.0f}s")
    assert noticed < 180, "the lost worker ends the attempt once Ray declares its node dead, not at a timeout"
    (lost,) = events(core, namespace, "spot-worker", "TrainerPreempted")
    said = re.search(
        rf"a policy worker was lost at step (\d+) \(pod {re.escape(pod.metadata.name)}, node [0-9.]+: its node left "
        r"the Ray cluster\); the retry resumes from checkpoint \S+/step_0*(\d+)",
        lost,
    )
    assert said, lost
    lost_at, saved = int(said.group(1)), int(said.group(2))
    assert saved == 4 * ((lost_at - 1) // 4), "the newest checkpoint before the lost step"
    attempts = trained_steps(core, namespace, "spot-worker", grpo_data)
    assert attempts[1][-1][0] == lost_at - 1, "attempt 1 stopped in the step it reports"
    assert attempts[1][:saved] + attempts[2] == dataset_order(STEPS), "the retry goes on from the checkpoint's step"
    custom = client.CustomObjectsApi(api_client)
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "spot-worker")
