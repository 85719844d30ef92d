"""A GRPOJob trains end to end on real pods from our own images: the helm-installed operator makes
the RayCluster (real Ray head and workers started by KubeRay), the environment server and the trainer
Job, which joins Ray at the GCS address of `<job>-endpoints`; the job succeeds with its reward up and
its progress in `kubectl get grpojobs`; deleting it deletes every child. Killing the Ray head at a
known step fails that attempt, and the retry `backoffLimit` allows resumes from its checkpoint and
succeeds."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from grpojob_api.endpoints import GCS_PORT, TENSORBOARD_PORT, TRAINER_METRICS_PORT
from grpojob_operator import names
from grpojob_testing import build
from grpojob_testing.cluster import wait_until
from grpojob_trainer.environments import get_environment
from tests.e2e.cluster_setup import image_names
from tests.e2e.conftest import wait_for_pod

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

GROUP, VERSION, PLURAL = "grpo.dev", "v1alpha1", "grpojobs"
TERMINAL = {"Succeeded", "Failed"}


def tiny_job(name: str, claim: str, max_steps: int, backoff_limit: int = 1) -> dict[str, Any]:
    """The tiny example (examples/tiny.yaml) on a claim, CPU only, small enough for 2 cores."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GRPOJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"path": "tiny-model", "pvc": {"claimName": claim}, "servedModelName": "tiny"},
            "dataset": {"path": "train.jsonl", "pvc": {"claimName": claim}},
            "environments": [{"name": "arithmetic", "args": ["arithmetic"]}],
            "generation": {"backend": "transformers", "gpusPerReplica": 0, "maxModelLen": 128, "maxNewTokens": 8},
            "training": {"gpusPerReplica": 0, "microBatchSize": 16, "optimizer": {"learningRate": 0.001}},
            "grpo": {"promptsPerStep": 8, "generationsPerPrompt": 8, "maxSteps": max_steps},
            "checkpointing": {"interval": 5},
            "backoffLimit": backoff_limit,
        },
    }


def kubectl(kubeconfig: Path, *args: str) -> str:
    """The pinned kubectl of the test cluster's build, or the one on PATH (kind users)."""
    pinned = build.load_components()["kubernetes"].bin_dir / "kubectl"
    program = str(pinned) if pinned.exists() else shutil.which("kubectl") or "kubectl"
    return subprocess.run([program, f"--kubeconfig={kubeconfig}", *args], capture_output=True, text=True).stdout


@dataclass
class Watch:
    """What a poll of the job's status saw: every (step, mean reward) and phase, in order."""

    rewards: dict[int, float] = field(default_factory=dict)
    phases: list[str] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)


def read_job(api_client, namespace: str, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(api_client).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def watch_job(api_client, namespace: str, name: str, timeout: float, until=None, watch: Watch | None = None) -> Watch:
    """Poll the job until it is terminal (or ``until(status)`` holds), recording its progress."""
    watch = watch or Watch()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = read_job(api_client, namespace, name).get("status") or {}
        watch.status = status
        if status.get("phase") and (not watch.phases or watch.phases[-1] != status["phase"]):
            watch.phases.append(status["phase"])
        if status.get("step") is not None and status.get("meanReward") is not None:
            watch.rewards[status["step"]] = status["meanReward"]
        if (until and until(status)) or (until is None and status.get("phase") in TERMINAL):
            return watch
        time.sleep(1)
    pytest.fail(f"GRPOJob {namespace}/{name} did not get there in {timeout:.0f}s: {watch}")


def children(api_client, namespace: str, uid: str) -> list[str]:
    """Every object in the namespace labelled with the job's uid: the operator's children, their pods
    and the RayCluster's pods (the operator's pod templates carry the label)."""
    selector = f"{names.JOB_UID_LABEL}={uid}"
    core, apps, batch = client.CoreV1Api(api_client), client.AppsV1Api(api_client), client.BatchV1Api(api_client)
    rbac = client.RbacAuthorizationV1Api(api_client)
    listings = {
        "role": rbac.list_namespaced_role,
        "rolebinding": rbac.list_namespaced_role_binding,
        "pod": core.list_namespaced_pod,
        "service": core.list_namespaced_service,
        "configmap": core.list_namespaced_config_map,
        "serviceaccount": core.list_namespaced_service_account,
        "deployment": apps.list_namespaced_deployment,
        "job": batch.list_namespaced_job,
    }
    found = [
        f"{kind}/{item.metadata.name}"
        for kind, list_ in listings.items()
        for item in list_(namespace, label_selector=selector).items
    ]
    rayclusters = client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        "ray.io", "v1", namespace, "rayclusters", label_selector=selector
    )
    found += [f"raycluster/{r['metadata']['name']}" for r in rayclusters["items"]]
    return found


# Run by a pod of the job's namespace that is not one of the job's: it tries the job's dashboard (which
# runs arbitrary jobs) and its GCS (`ray start --address`, as a node joins) without the job's token,
# with a wrong one, and, to show the way is open to the token alone, with it.
STRANGER_SCRIPT = """
import json, os, subprocess, urllib.error, urllib.request
head, token = os.environ["HEAD"], os.environ.pop("JOB_TOKEN")
def dashboard(headers):
    request = urllib.request.Request(f"http://{head}:8265/api/jobs/", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
def join(env):
    command = ["ray", "start", f"--address={head}:6379", "--num-cpus=0", "--disable-usage-stats"]
    try:
        run = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "no answer"
    if run.returncode == 0:
        return "joined"
    return "refused: InvalidAuthToken" if "InvalidAuthToken" in run.stderr else run.stderr[-1500:]
results = {
    "dashboard without a token": dashboard({}),
    "dashboard with a wrong token": dashboard({"Authorization": "Bearer not-the-token"}),
    "dashboard with the token": dashboard({"Authorization": "Bearer " + token}),
    "gcs with auth disabled": join({"RAY_AUTH_MODE": "disabled"}),
    "gcs with a wrong token": join({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "not-the-token"}),
    "gcs with the token": join({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}),
}
subprocess.run(["ray", "stop", "--force"], capture_output=True)
print("RESULTS " + json.dumps(results))
"""


def stranger_pod(job: str, namespace: str) -> dict[str, Any]:
    """A pod of the Ray image in the job's namespace, without the job's labels, running STRANGER_SCRIPT
    (given the job's token under another name, for the control that it is the token that opens)."""
    secret = {"secretKeyRef": {"name": names.ChildNames(job).ray_token_secret, "key": "auth_token"}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{job}-stranger"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "stranger",
                    "image": image_names()["trainer-cpu"],
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "-c", STRANGER_SCRIPT],
                    "env": [
                        {
                            "name": "HEAD",
                            "value": f"{names.ChildNames(job).head_service}.{namespace}.svc.cluster.local",
                        },
                        {"name": "JOB_TOKEN", "valueFrom": secret},
                    ],
                }
            ],
        },
    }


def test_a_grpojob_trains_on_real_pods_and_deleting_it_removes_every_child(
    api_client, kubeconfig, namespace, grpo_data
):
    """The tiny job, evaluated on held-out rows from a ConfigMap before training and every 8 steps
    (`spec.evaluation`): the evaluations reach `status` and the EVAL column of `kubectl get grpojobs`."""
    custom = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    started = time.monotonic()
    held_out = "\n".join(json.dumps(row) for row in get_environment("arithmetic").make_rows(8, seed=99))
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "tiny-held-out"}, "data": {"test.jsonl": held_out}}
    )
    manifest = tiny_job("tiny", grpo_data, 16)
    manifest["spec"]["evaluation"] = {
        "dataset": {"configMap": {"name": "tiny-held-out", "key": "test.jsonl"}},
        "everySteps": 8,
        "temperature": 0.0,
    }
    job = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    uid = job["metadata"]["uid"]

    running = watch_job(api_client, namespace, "tiny", 900, until=lambda s: (s.get("step") or 0) >= 2)
    table = kubectl(kubeconfig, "get", "grpojobs", "-n", namespace)
    endpoints = core.read_namespaced_config_map(names.ChildNames("tiny").endpoints, namespace)
    # Colocated, the default of an on-policy job: one Ray worker pod holds the engine and the policy's rank,
    # placed by the same trainer code path as `grpojob run` and a GPU node's pods.
    workers = core.list_namespaced_pod(namespace, label_selector="ray.io/cluster=tiny,ray.io/node-type=worker").items
    assert [p.metadata.labels["ray.io/group"] for p in workers] == ["colocated"]

    watched = watch_job(api_client, namespace, "tiny", 1200, watch=running)
    print(f"GRPOJob tiny: {watched.phases} in {time.monotonic() - started:.0f}s; rewards by step {watched.rewards}")
    print(table)

    assert watched.status["phase"] == "Succeeded", watched.status
    assert watched.status["step"] == 16
    assert table.split()[:8] == ["NAME", "PHASE", "STEP", "REWARD", "EVAL", "ATTEMPT", "PLACEMENT", "AGE"]
    row = table.splitlines()[1].split()
    assert row[:2] == ["tiny", "Running"] and 0.0 <= float(row[4]) <= 1.0, "the baseline evaluation's reward"
    assert row[6] == "colocated" == watched.status["placement"]
    assert watched.status["lastEvaluation"]["step"] == 16
    assert watched.status["bestEvaluation"]["step"] in (8, 16)
    assert "evaluation of step 0: reward" in trainer_log(core, namespace, "tiny", 1)
    steps = sorted(watched.rewards)
    first, last = steps[: len(steps) // 2], steps[len(steps) // 2 :]
    assert sum(watched.rewards[s] for s in last) / len(last) > sum(watched.rewards[s] for s in first) / len(first)
    assert endpoints.data["RAY_GCS_ADDRESS"] == f"tiny-head-svc.{namespace}.svc.cluster.local:{GCS_PORT}"

    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "tiny")
    wait_until(lambda: children(api_client, namespace, uid) == [], "every child of the GRPOJob to be deleted", 180)


GUARDED_STEPS = 100_000
"""Steps of the job the stranger test probes: more than it can reach while probed, so its Ray cluster is
up for the whole probe (the test deletes it after)."""


def test_a_pod_without_the_jobs_ray_token_cannot_drive_its_ray_cluster(api_client, namespace, grpo_data):
    """While a job trains, a pod that is not the job's is refused by its dashboard and its GCS without the
    job's token or with a wrong one, and let in with it."""
    custom = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, tiny_job("guarded", grpo_data, GUARDED_STEPS)
    )
    watch_job(api_client, namespace, "guarded", 900, until=lambda s: (s.get("step") or 0) >= 1)
    core.create_namespaced_pod(namespace, stranger_pod("guarded", namespace))
    stranger = wait_for_pod(core, namespace, "guarded-stranger", {"Succeeded", "Failed"}, 600)
    log = core.read_namespaced_pod_log("guarded-stranger", namespace)
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "guarded")
    assert stranger.status.phase == "Succeeded", log
    results = json.loads(log.split("RESULTS ", 1)[1])
    print(f"a stranger to the job's Ray cluster: {results}")
    assert (results["dashboard without a token"], results["dashboard with a wrong token"]) == (401, 403)
    refused = "refused: InvalidAuthToken"
    assert (results["gcs with auth disabled"], results["gcs with a wrong token"]) == (refused, refused)
    assert (results["dashboard with the token"], results["gcs with the token"]) == (200, "joined")
    wait_until(lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"], "", 180)


KILL_AFTER_STEP = 3
"""The head-kill test kills the Ray head once the job's progress shows this step (its checkpoint of step 2
is on the claim by then)."""
HEAD_KILL_MAX_STEPS = 12
"""Steps of the head-kill job: more than attempt 1 can reach before its trainer notices the lost head (at
the check before its next step), so the kill always ends attempt 1."""


def trainer_log(core: client.CoreV1Api, namespace: str, job: str, attempt: int) -> str:
    """The log of the trainer pod of one attempt."""
    selector = f"{names.JOB_LABEL}={job},{names.COMPONENT_LABEL}=trainer,{names.ATTEMPT_LABEL}={attempt}"
    (pod,) = core.list_namespaced_pod(namespace, label_selector=selector).items
    return core.read_namespaced_pod_log(pod.metadata.name, namespace)


def test_killing_the_ray_head_mid_run_fails_the_attempt_and_the_retry_resumes_from_its_checkpoint(
    api_client, namespace, grpo_data
):
    """Attempt 1 loses its Ray cluster when the head pod is killed at a known step and fails; attempt 2
    (``backoffLimit: 1``) joins the new head, resumes from the newest checkpoint on the claim and succeeds."""
    custom = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    manifest = tiny_job("headless", grpo_data, HEAD_KILL_MAX_STEPS, backoff_limit=1)
    manifest["spec"]["checkpointing"] = {"interval": 2, "pvc": {"claimName": grpo_data}}
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    started = time.monotonic()
    watch = watch_job(api_client, namespace, "headless", 900, until=lambda s: (s.get("step") or 0) >= KILL_AFTER_STEP)
    assert watch.status["attempt"] == 1, watch.status
    killed_at = (watch.status["step"], time.monotonic() - started)
    endpoints_name = names.ChildNames("headless").endpoints
    head_ip = core.read_namespaced_config_map(endpoints_name, namespace).data["RAY_HEAD_POD_IP"]
    heads = core.list_namespaced_pod(namespace, label_selector="ray.io/cluster=headless,ray.io/node-type=head")
    for pod in heads.items:
        core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)

    def new_head_published() -> bool:
        data = core.read_namespaced_config_map(endpoints_name, namespace).data
        return data["RAY_HEAD_POD_IP"] != head_ip

    wait_until(new_head_published, "the endpoints to name the new Ray head pod", 300)
    retried = watch_job(
        api_client,
        namespace,
        "headless",
        600,
        until=lambda s: (s.get("attempt") or 0) >= 2 or s.get("phase") in TERMINAL,
        watch=watch,
    )
    retry = (retried.status.get("step"), time.monotonic() - started)
    assert retried.status["attempt"] == 2, f"attempt 1 ended as if the head had not been killed: {retried.status}"
    watched = watch_job(api_client, namespace, "headless", 1200, watch=retried)
    status = watched.status
    print(
        f"GRPOJob headless: head killed at step {killed_at[0]} ({killed_at[1]:.0f}s), attempt 2 from step "
        f"{retry[0]} ({retry[1]:.0f}s), {status['phase']} at step {status.get('step')} "
        f"({time.monotonic() - started:.0f}s); phases {watched.phases}"
    )

    assert (status["phase"], status["attempt"], status["step"]) == ("Succeeded", 2, HEAD_KILL_MAX_STEPS), status
    second_log = trainer_log(core, namespace, "headless", 2)
    resumed = re.search(r"resumed from the checkpoint of step (\d+)", second_log)
    assert resumed, "attempt 2 started from scratch instead of the checkpoint of attempt 1"
    assert KILL_AFTER_STEP - 1 <= int(resumed.group(1)) < HEAD_KILL_MAX_STEPS
    first_step = re.search(rf"step (\d+)/{HEAD_KILL_MAX_STEPS} ", second_log)
    assert first_step and int(first_step.group(1)) == int(resumed.group(1)) + 1, (
        "attempt 2's first step is not the step after its checkpoint's"
    )
    # Deleted while the operator still runs (no finalizer holds it; its children are garbage-collected).
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "headless")
    wait_until(lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"], "", 120)


HUB_MODEL_ID = "grpojob-e2e/tiny-chat"


def run_pod(core: client.CoreV1Api, namespace: str, name: str, claim: str, script: str) -> str:
    """Run ``script`` in a pod of the trainer image with the claim at /data; its log once it succeeded."""
    from tests.e2e.cluster_setup import image_names
    from tests.e2e.conftest import wait_for_pod

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsUser": 1000, "runAsGroup": 100, "fsGroup": 100},
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
            "containers": [
                {
                    "name": "run",
                    "image": image_names()["trainer-cpu"],
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", script],
                    "env": [{"name": "HOME", "value": "/tmp"}, {"name": "HF_HUB_OFFLINE", "value": "1"}],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
        },
    }
    core.create_namespaced_pod(namespace, pod)
    done = wait_for_pod(core, namespace, name, {"Succeeded", "Failed"}, 300)
    log = core.read_namespaced_pod_log(name, namespace)
    assert done.status.phase == "Succeeded", log
    return log


def test_a_lora_job_names_its_model_by_hub_id_and_leaves_a_merged_model_transformers_loads(
    api_client, namespace, grpo_data
):
    """The claim holds a hub cache filled beforehand (`grpojob cache-model`: no network here); the job names
    its model by id, offline: the download Job resolves it to a commit before any Ray pod starts, every pod
    loads that snapshot. The policy trains a LoRA adapter (`spec.training.lora`) and sends the engine the
    adapter alone each step; the adapter merged into the base is exported to the claim, where
    `transformers` loads it as it is."""
    custom, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    run_pod(
        core, namespace, "fill-cache", grpo_data, f"grpojob cache-model /data/tiny-model {HUB_MODEL_ID} --cache /data"
    )
    manifest = tiny_job("hub", grpo_data, 4)
    manifest["spec"]["model"] = {
        "id": HUB_MODEL_ID,
        "offline": True,
        "cache": {"claimName": grpo_data},
        "servedModelName": "tiny",
    }
    manifest["spec"]["checkpointing"] = {"interval": 2, "pvc": {"claimName": grpo_data}}
    manifest["spec"]["training"]["lora"] = {"rank": 8, "alpha": 16}
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)

    watched = watch_job(api_client, namespace, "hub", 1200)

    status = watched.status
    print(f"GRPOJob hub: {watched.phases}; model {status.get('modelCommit')}; output {status.get('outputModel')}")
    assert status["phase"] == "Succeeded", status
    ready = next(c for c in status["conditions"] if c["type"] == "ModelReady")
    assert ready["status"] == "True" and status["modelCommit"] in ready["message"]
    assert status["outputModel"] == {"claimName": grpo_data, "path": "models/hub/final", "step": 4, "format": "merged"}
    trained = trainer_log(core, namespace, "hub", 1)
    assert "exported the model of step 4" in trained
    assert re.search(r"weight sync: \S+ of the adapter", trained), trained[-3000:]
    log = run_pod(
        core,
        namespace,
        "load-model",
        grpo_data,
        'python -c "from transformers import AutoModelForCausalLM, AutoTokenizer; '
        "m = AutoModelForCausalLM.from_pretrained('/data/models/hub/final'); "
        "t = AutoTokenizer.from_pretrained('/data/models/hub/final'); "
        "print('loaded', m.num_parameters(), t.chat_template is not None)\"",
    )
    assert "loaded" in log and log.strip().endswith("True"), log


WATCHED_STEPS = 16


def trainer_pod(core: client.CoreV1Api, namespace: str, job: str, attempt: int) -> str:
    selector = f"{names.JOB_LABEL}={job},{names.COMPONENT_LABEL}=trainer,{names.ATTEMPT_LABEL}={attempt}"
    (pod,) = core.list_namespaced_pod(namespace, label_selector=selector).items
    return pod.metadata.name


def scraped_step(core: client.CoreV1Api, namespace: str, pod: str, job: str) -> int | None:
    """The step on the trainer pod's `/metrics`, read through the API server's proxy."""
    where = f"{pod}:{TRAINER_METRICS_PORT}"
    try:
        answer = core.connect_get_namespaced_pod_proxy_with_path(where, namespace, "metrics", _preload_content=False)
    except client.ApiException:
        return None
    text = answer.data.decode()
    found = re.search(rf'^grpojob_trainer_step{{grpojob="{job}"}} ([0-9.e+]+)$', text, re.MULTILINE)
    return int(float(found.group(1))) if found else None


def tensorboard_scalars(core: client.CoreV1Api, namespace: str, job: str) -> dict[str, Any]:
    """The scalar tags of each run, as TensorBoard behind `<job>-tensorboard` lists them (via the API server)."""
    service = f"{names.ChildNames(job).tensorboard}:{TENSORBOARD_PORT}"
    try:
        answer = core.connect_get_namespaced_service_proxy_with_path(
            service, namespace, "data/plugin/scalars/tags", _preload_content=False
        )
    except client.ApiException:
        return {}  # not up yet
    return json.loads(answer.data)


def test_a_watched_job_serves_its_metrics_and_tensorboard_during_the_run_and_leaves_its_events_on_its_claim(
    api_client, namespace, grpo_data
):
    """`spec.logging` on the data claim with TensorBoard: while the job runs, the trainer's `/metrics` shows
    the step `kubectl get grpojobs` shows and `<job>-tensorboard` lists the attempt's scalars; the trainer's
    log has a line per step; the events stay on the claim."""
    custom, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    manifest = tiny_job("watched", grpo_data, WATCHED_STEPS)
    manifest["spec"]["logging"] = {"pvc": {"claimName": grpo_data}, "tensorboard": True}
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    running = watch_job(api_client, namespace, "watched", 900, until=lambda s: (s.get("step") or 0) >= 1)
    pod = trainer_pod(core, namespace, "watched", 1)

    def scrape_agrees_with_status() -> bool:
        before = read_job(api_client, namespace, "watched")["status"].get("step")
        scraped = scraped_step(core, namespace, pod, "watched")
        after = read_job(api_client, namespace, "watched")["status"].get("step")
        print(f"status step {before}/{after}, /metrics step {scraped}")
        return before == scraped == after

    wait_until(scrape_agrees_with_status, "the trainer's /metrics to show the status's step", 120)

    phase_when_listed: list[str] = []

    def tensorboard_lists_the_reward() -> bool:
        listed = "rollout/reward/mean" in tensorboard_scalars(core, namespace, "watched").get("attempt-1", {})
        if listed:
            phase_when_listed.append(read_job(api_client, namespace, "watched")["status"]["phase"])
        return listed

    wait_until(tensorboard_lists_the_reward, "TensorBoard to list attempt-1's mean reward", 300)
    watched = watch_job(api_client, namespace, "watched", 1200, watch=running)
    assert phase_when_listed == ["Running"], "TensorBoard answered only after the run"
    assert watched.status["phase"] == "Succeeded", watched.status

    log = trainer_log(core, namespace, "watched", 1)
    step_lines = re.findall(rf"step (\d+)/{WATCHED_STEPS} reward \S+ time \S+s .* failed rollouts \d+/64", log)
    assert [int(s) for s in step_lines] == list(range(1, WATCHED_STEPS + 1)), log[-3000:]
    claim = core.read_namespaced_persistent_volume_claim(grpo_data, namespace)
    volume = core.read_persistent_volume(claim.spec.volume_name)
    if volume.spec.host_path is not None:  # our real node (kind's volumes are inside its node container)
        run_dir = Path(volume.spec.host_path.path) / "logs" / "watched" / "attempt-1"
        assert list(run_dir.glob("events.out.tfevents.*")), sorted(p.name for p in run_dir.parent.rglob("*"))
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records] == list(range(1, WATCHED_STEPS + 1))
    # After the run (cleanupPolicy DeleteCluster) TensorBoard still serves the finished curve from the claim.
    assert "rollout/reward/mean" in tensorboard_scalars(core, namespace, "watched")["attempt-1"]
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "watched")
