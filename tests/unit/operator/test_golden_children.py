"""Golden files: every child the operator builds for every example GRPOJob (and for a Kueue-managed,
watched and scheduled variant of the arithmetic example, and a Kueue-managed variant of the hub example),
rendered to YAML under `golden/`. A change to what a job's children look like shows up as a diff of these
files; a refactor that keeps behaviour leaves them equal. Regenerate after an intended change with
``GRPOJOB_UPDATE_GOLDEN=1 pytest <this file>`` and read the diff.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpojob_api import v1alpha1 as api
from grpojob_api.admission import parse_job
from grpojob_api.hub import dataset_key
from grpojob_operator import kueue
from grpojob_operator.children.claims import model_cache_claim
from grpojob_operator.children.endpoints import build_endpoints
from grpojob_operator.children.environments import build_environment_deployment, build_environment_service
from grpojob_operator.children.model import build_model_cache_claim, build_model_download_job
from grpojob_operator.children.nemo_gym import build_nemo_gym_config_map, build_nemo_gym_deployment
from grpojob_operator.children.network import build_network_policy
from grpojob_operator.children.raycluster import build_generation_service, build_raycluster
from grpojob_operator.children.tensorboard import build_tensorboard_deployment, build_tensorboard_service
from grpojob_operator.children.trainer import build_config_map, build_trainer_job, build_trainer_rbac
from grpojob_operator.settings import OperatorSettings

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).with_name("golden")
HEAD_POD = "demo-head-x7k2p"
HEAD_IP = "10.0.0.2"
ATTEMPT = 2
MODEL_COMMIT = "0123456789abcdef0123456789abcdef01234567"
DATASET_COMMIT = "89abcdef0123456789abcdef0123456789abcdef"


def example_jobs() -> dict[str, dict[str, Any]]:
    """Every GRPOJob of examples/, by file stem, in namespace `rl`."""
    jobs = {}
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document and document.get("kind") == "GRPOJob":
                document["metadata"].setdefault("namespace", "rl")
                document["metadata"]["uid"] = "0f1e2d3c-0000-4000-8000-000000000001"
                jobs[path.stem] = document
    return jobs


def queued_watched_variant(example: dict[str, Any]) -> dict[str, Any]:
    """An example admitted through Kueue, with TensorBoard and a scheduling rule for every role."""
    job = copy.deepcopy(example)
    job["metadata"]["name"] = "queued-watched"
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/priority-class": "high"}
    job["spec"]["logging"] = {"tensorboard": True}
    rule = {"nodeSelector": {"pool": "rl"}, "tolerations": [{"key": "rl", "operator": "Exists"}]}
    job["spec"]["scheduling"] = dict.fromkeys(("head", "generation", "policy", "environments", "trainer"), rule)
    return job


def queued_hub_variant(example: dict[str, Any]) -> dict[str, Any]:
    """The hub-model example admitted through Kueue: its Workload comes before the model's download."""
    job = copy.deepcopy(example)
    job["metadata"]["name"] = "queued-hub"
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    return job


def all_jobs() -> dict[str, dict[str, Any]]:
    jobs = example_jobs()
    jobs["queued-watched"] = queued_watched_variant(jobs["qwen2.5-1.5b-arithmetic"])
    jobs["queued-hub"] = queued_hub_variant(jobs["qwen2.5-1.5b-instruct-hub"])
    return jobs


def render_children(job: api.GRPOJob, settings: OperatorSettings) -> list[dict[str, Any]]:
    """Every child of ``job`` as the operator would create it once the Ray head is up (attempt 2)."""
    children: list[dict[str, Any]] = [build_network_policy(job)]
    if job.spec.model.id is not None or job.spec.hub_datasets():
        if model_cache_claim(job) == f"{job.metadata.name}-model-cache":
            children.append(build_model_cache_claim(job))
        children.append(build_model_download_job(job, settings))
    children += [
        build_raycluster(job, settings),
        build_config_map(job),
        build_generation_service(job),
        *build_trainer_rbac(job),
    ]
    if job.spec.logging.tensorboard:
        children += [build_tensorboard_deployment(job, settings), build_tensorboard_service(job)]
    endpoints = build_endpoints(job, settings, HEAD_IP, ATTEMPT)
    children.append(endpoints)
    for env in job.spec.environments:
        if env.nemo_gym is not None:
            children.append(build_nemo_gym_config_map(job, env, endpoints["data"]))
            children.append(build_nemo_gym_deployment(job, env, settings, endpoints["data"], HEAD_POD))
        else:
            children.append(build_environment_deployment(job, env, settings, ATTEMPT))
        children.append(build_environment_service(job, env))
    commit = MODEL_COMMIT if job.spec.model.id is not None else None
    dataset_commits = {dataset_key(source): DATASET_COMMIT for _, source in job.spec.hub_datasets()}
    children.append(build_trainer_job(job, settings, ATTEMPT, commit, dataset_commits))
    if kueue.queue_name(job) is not None:
        children.append(kueue.build_workload(job, settings, priority=1000))
    return children


def rendered(name: str, body: dict[str, Any]) -> str:
    job = parse_job(body)
    children = render_children(job, OperatorSettings())
    return yaml.safe_dump_all(children, sort_keys=True, default_flow_style=False, width=1000)


@pytest.mark.parametrize("name", sorted(all_jobs()))
def test_the_children_of_each_example_job_are_as_recorded(name: str) -> None:
    text = rendered(name, all_jobs()[name])
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("GRPOJOB_UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run with GRPOJOB_UPDATE_GOLDEN=1 to record it"
    assert text == path.read_text(), f"the children of {name} differ from {path.name} (see the diff above)"


def test_every_example_job_has_a_golden_file_and_no_golden_file_is_stale() -> None:
    assert {p.stem for p in GOLDEN.glob("*.yaml")} == set(all_jobs())
