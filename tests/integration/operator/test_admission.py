"""`kubectl apply` and `grpojob run` judge every GRPOJob manifest alike.

A few hundred manifests, mutated from a valid one with a fixed seed (wrong types, bounds, nulls,
cross-field rules, quantities, names), go through the API server's dry run (with the CRD the chart
installs) and through the model as `grpojob run` loads a file. Both verdicts agree, every refusal
names a field that was mutated, what the API server admits it defaults as the model does, and the
environment Deployments the operator builds from an admitted job are accepted too (no ChildRejected).
"""

from __future__ import annotations

import copy
import json
import random
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from grpojob_api import admission, kubeyaml
from grpojob_api import v1alpha1 as api
from grpojob_operator.children.environments import build_environment_deployment
from grpojob_operator.settings import OperatorSettings
from grpojob_testing import build
from grpojob_trainer.commands.job import load_job
from grpojob_trainer.errors import UsageError

from .conftest import GROUP, PLURAL, VERSION

pytestmark = pytest.mark.integration

SEED = 20261130
MANIFESTS = 320

BASE: dict[str, Any] = {
    "apiVersion": api.API_VERSION,
    "kind": api.KIND,
    "metadata": {"name": "fuzz"},
    "spec": {
        "model": {"path": "/models/tiny", "pvc": {"claimName": "models", "path": "tiny"}},
        "dataset": {"path": "data/train.jsonl", "pvc": {"claimName": "data"}},
        "environments": [
            {
                "name": "arith",
                "command": ["python", "-m", "env"],
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
                "env": [{"name": "LEVEL", "value": "1"}, {"name": "TOKEN", "secretKeyRef": {"name": "s", "key": "k"}}],
            }
        ],
        "generation": {"gpusPerReplica": 1, "maxModelLen": 2048, "maxNewTokens": 256, "temperature": 1.0},
        "training": {"gpusPerReplica": 1, "optimizer": {"learningRate": 1e-5}},
        "grpo": {"maxSteps": 10, "seed": 3, "clipHigh": 0.28},
        "checkpointing": {"path": "ckpt/fuzz", "interval": 5},
        "suspend": False,
    },
}

DELETE = object()
Path_ = tuple[str | int, ...]

INTEGERS = [0, 1, 7, -1, 100, "3", 3.0, 2.5, 2**31, 2**53, 2**63 - 1, 2**63, -(2**63) - 1, True, None, DELETE]
NUMBERS = [0, 0.0, 0.5, 1, 2, 2.5, -0.1, 1e9, "0.5", True, None, DELETE, 2**63, 2**53 + 1]
BOOLEANS = [True, False, "yes", "true", 1, 0, None, DELETE]
VOLUME_PATHS = ["tiny", "a/b", "../x", "a/../b", "a/..", "..", "a/..b", "..a", "/abs", "", "a//b", 3, None, DELETE]
QUANTITIES = [
    *("1", "500m", "2Gi", "1Pi", "1e3", ".5", "1.5m", "1.", "+1", "-1", "0", "1e-3", "1E3", "1.5Gi", "1Ei", "7Ki"),
    *("1GB", "1 Gi", "", "1K", "Ki", "1E", "1e", "1.2.3", "1e3.5", "0x10", 2, 0.5, None),
]
RESOURCE_NAMES = ["cpu", "memory", "ephemeral-storage", "nvidia.com/gpu", "storage", "example.com/foo", "hugepages-2Mi"]
NAMES = ["fuzz", "a.b", "1job", "a-b", "A", "a" * 40, "a" * 41, "a-", "-a", "job-2", "x", ""]
ENVIRONMENT_NAMES = ["arith", "other", "a.b", "1env", "e" * 18, "e" * 19, "Env", "", 3, None]
ENUMS: dict[Path_, list[Any]] = {
    ("spec", "generation", "backend"): ["vllm", "transformers", "VLLM", "tensorrt", 1, None, DELETE],
    ("spec", "training", "precision"): ["bf16", "fp32", "fp16", None],
    ("spec", "cleanupPolicy"): ["DeleteAll", "KeepAll", "DeleteCluster", "deleteall", None],
    ("spec", "grpo", "klEstimator"): ["k1", "k3", "k2", None],
    ("spec", "grpo", "lossAggregation"): ["token", "sequence", "tokens"],
    ("spec", "training", "optimizer", "name"): ["adamw", "sgd", None],
    ("spec", "output", "dtype"): ["bfloat16", "float32", "float16", None],
}

ENV = ("spec", "environments", 0)
SCHEDULING = ("spec", "scheduling")
FIELDS: dict[Path_, list[Any]] = {
    ("metadata", "name"): NAMES,
    ("spec", "generation", "replicas"): INTEGERS,
    ("spec", "generation", "gpusPerReplica"): INTEGERS,
    ("spec", "generation", "maxModelLen"): [*INTEGERS, 16, 256, 512, 1024, 1025],
    ("spec", "generation", "maxNewTokens"): [*INTEGERS, 2047, 2048, 4096],
    ("spec", "generation", "temperature"): [*NUMBERS, 2.0, 2.01, 1e-9],
    ("spec", "generation", "topP"): NUMBERS,
    ("spec", "generation", "gpuMemoryUtilization"): NUMBERS,
    ("spec", "training", "replicas"): INTEGERS,
    ("spec", "training", "microBatchSize"): INTEGERS,
    ("spec", "training", "gradientCheckpointing"): BOOLEANS,
    ("spec", "training", "torchCompile"): BOOLEANS,
    ("spec", "training", "optimizer", "learningRate"): NUMBERS,
    ("spec", "training", "optimizer", "beta2"): [*NUMBERS, 0.999, 1.0],
    ("spec", "grpo", "maxSteps"): INTEGERS,
    ("spec", "grpo", "seed"): INTEGERS,
    ("spec", "grpo", "generationsPerPrompt"): INTEGERS,
    ("spec", "grpo", "clipLow"): NUMBERS,
    ("spec", "grpo", "klCoef"): NUMBERS,
    ("spec", "grpo", "importanceSamplingCap"): NUMBERS,
    ("spec", "grpo", "rolloutTimeoutSeconds"): NUMBERS,
    ("spec", "grpo", "advantage", "normalizeStd"): BOOLEANS,
    ("spec", "grpo", "maxFailedSteps"): INTEGERS,
    ("spec", "grpo", "miniBatches"): [*INTEGERS, 64, 65],
    ("spec", "checkpointing", "interval"): INTEGERS,
    ("spec", "checkpointing", "path"): VOLUME_PATHS,
    ("spec", "model", "path"): ["/models/x", "", 3, None, DELETE],
    ("spec", "model", "pvc", "path"): VOLUME_PATHS,
    ("spec", "model", "pvc"): [None, {}, {"claimName": ""}, "models", DELETE],
    ("spec", "model", "id"): ["Qwen/Qwen2.5-0.5B", "bad id", "a/b/c", "", None, DELETE],
    ("spec", "model", "revision"): ["main", "", None, DELETE],
    ("spec", "model", "offline"): BOOLEANS,
    ("spec", "model", "cache"): [None, {}, {"claimName": "hf"}, {"size": "1Ti"}, {"size": "x"}],
    ("spec", "output", "path"): VOLUME_PATHS,
    ("spec", "output", "everyCheckpoint"): BOOLEANS,
    ("spec", "dataset", "path"): ["rows.jsonl", "", None, DELETE, 7],
    ("spec", "dataset", "pvc", "path"): VOLUME_PATHS,
    ("spec", "dataset", "pvc"): [None, DELETE, {"claimName": "data", "path": "../etc"}],
    ("spec", "dataset", "configMap"): [{"name": "rows"}, {"name": "rows", "key": ""}, {}, None],
    ("spec", "suspend"): BOOLEANS,
    ("spec", "backoffLimit"): INTEGERS,
    ("spec", "activeDeadlineSeconds"): INTEGERS,
    ("spec", "ttlSecondsAfterFinished"): INTEGERS,
    ("spec", "generation"): [None, {}, DELETE, {"maxModelLen": 512}, {"backend": "vllm", "gpusPerReplica": 0}],
    ("spec", "grpo"): [None, {}, {"unknownKnob": 1}],
    ("spec", "environments"): [None, [], DELETE, "arith"],
    ("spec", "unknownField"): [1, None, {}],
    (*ENV, "name"): ENVIRONMENT_NAMES,
    (*ENV, "port"): [*INTEGERS, 1023, 65535, 65536],
    (*ENV, "image"): ["img:1", None, 3, ""],
    (*ENV, "command"): [["a"], [], None, "python", [1]],
    (*ENV, "resources"): [None, {}, {"requests": None}],
    (*ENV, "env", 0, "value"): ["x", "", None, DELETE, 3],
    (*ENV, "env", 0, "secretKeyRef"): [{"name": "s", "key": "k"}, {"name": "s"}, None],
    (*ENV, "env", 1, "secretKeyRef"): [None, DELETE, {"name": "", "key": "k"}],
    (*ENV, "env", 1, "name"): ["LEVEL", "OK_2", "bad name", "", "9X", None],
    ("spec", "progressDeadlineSeconds"): INTEGERS,
    (*SCHEDULING, "head", "nodeSelector"): [{"pool": "cpu"}, {"pool": 1}, {"pool": "x" * 64}, {}, None, "pool"],
    (*SCHEDULING, "policy", "tolerations"): [
        [{"key": "k", "operator": "Exists"}, {"key": "k", "value": "v", "effect": "NoSchedule"}],
        [{"operator": "Exists"}],
        [{"operator": "Exists", "value": "v"}],
        [{"value": "v"}],
        [{"key": "k", "tolerationSeconds": 5}],
        [{"key": "k", "effect": "NoExecute", "tolerationSeconds": 5}],
        [{"key": "k", "operator": "In"}],
        [{"key": "k", "effect": "NoRun"}],
        [],
        None,
        "k",
    ],
    (*SCHEDULING, "generation", "affinity"): [
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}},
        {"podAntiAffinity": {}},
        {"nodeAffinity": "zone-a"},
        None,
        {},
    ],
    (*SCHEDULING, "environments", "priorityClassName"): ["high", "a.b-c", "High", "", None, 3],
    (*SCHEDULING, "environments", "schedulerName"): ["gang", "", None],
    (*SCHEDULING, "trainer", "labels"): [
        {"team": "rl"},
        {"grpo.dev/job": "x"},
        {"kueue.x-k8s.io/queue-name": "q"},
        {"app.kubernetes.io/managed-by": "me"},
        {"team": 1},
        {"team": "x" * 64},
        None,
        "team",
    ],
    (*SCHEDULING, "trainer", "annotations"): [{"note": "x"}, {"note": 1}, None],
}
for path, values in ENUMS.items():
    FIELDS[path] = values
for side in ("requests", "limits"):
    for name in RESOURCE_NAMES:
        FIELDS[(*ENV, "resources", side, name)] = [*QUANTITIES, DELETE]


def _second_environment(name: str) -> Callable[[dict[str, Any]], Path_]:
    def mutate(manifest: dict[str, Any]) -> Path_:
        environments = manifest["spec"].get("environments")
        if isinstance(environments, list) and environments and isinstance(environments[0], dict):
            environments.append({**copy.deepcopy(environments[0]), "name": name})
        return ("spec", "environments")

    return mutate


def _env_var(var: dict[str, Any]) -> Callable[[dict[str, Any]], Path_]:
    def mutate(manifest: dict[str, Any]) -> Path_:
        env = _get(manifest, (*ENV, "env"))
        if isinstance(env, list):
            env.append(var)
        return (*ENV, "env")

    return mutate


def _nothing_but(path: Path_, value: Any) -> Callable[[dict[str, Any]], Path_]:
    """Replace a whole section (so that one rule meets its defaults)."""

    def mutate(manifest: dict[str, Any]) -> Path_:
        _set(manifest, path, value)
        return path

    return mutate


SHAPES: list[Callable[[dict[str, Any]], Path_]] = [
    _second_environment("arith"),
    _second_environment("other"),
    _env_var({"name": "LEVEL", "value": "2"}),
    _env_var({"name": "BOTH", "value": "x", "secretKeyRef": {"name": "s", "key": "k"}}),
    _env_var({"name": "NEITHER"}),
    _env_var({"name": "NULLS", "value": None, "secretKeyRef": None}),
    _nothing_but(("spec", "dataset"), {"configMap": {"name": "rows"}}),
    _nothing_but(("spec", "dataset"), {"configMap": {"name": "rows"}, "path": "x"}),
    _nothing_but(("spec", "dataset"), {"pvc": {"claimName": "data"}, "configMap": {"name": "rows"}}),
    _nothing_but(("spec", "dataset"), {}),
    _nothing_but(("spec", "generation"), {"maxModelLen": 1024}),
    _nothing_but(("spec", "grpo"), {"promptsPerStep": 2, "generationsPerPrompt": 3, "miniBatches": 6}),
    _nothing_but(("spec", "grpo"), {"promptsPerStep": 2, "generationsPerPrompt": 3, "miniBatches": 7}),
    _nothing_but(("spec", "generation"), {"maxModelLen": 1025, "temperature": 0}),
    _nothing_but((*ENV, "resources"), {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}),
    _nothing_but((*ENV, "resources"), {"requests": {"cpu": "1"}, "limits": {"cpu": "1000m"}}),
    _nothing_but((*ENV, "resources"), {"requests": {"memory": "1Gi"}, "limits": {"memory": "1e9"}}),
    _nothing_but((*ENV, "resources"), {"requests": {"nvidia.com/gpu": "1"}}),
    _nothing_but((*ENV, "resources"), {"limits": {"nvidia.com/gpu": "2"}}),
    _nothing_but((*ENV, "resources"), {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}}),
    _nothing_but((*ENV, "resources"), {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}),
    _nothing_but((*ENV, "resources"), {"limits": {"nvidia.com/gpu": "500m"}}),
]


def _get(document: Any, path: Path_) -> Any:
    for part in path:
        try:
            document = document[part]
        except (KeyError, IndexError, TypeError):
            return None
    return document


def _set(document: Any, path: Path_, value: Any) -> None:
    """Set (or with DELETE remove) ``path``, creating missing objects; nothing where the way is not one."""
    *parents, last = path
    for part in parents:
        if isinstance(document, dict) and isinstance(part, str):
            document = document.setdefault(part, {})
        elif isinstance(document, list) and isinstance(part, int) and part < len(document):
            document = document[part]
        else:
            return
    if isinstance(document, dict) and isinstance(last, str):
        if value is DELETE:
            document.pop(last, None)
        else:
            document[last] = copy.deepcopy(value)
    elif isinstance(document, list) and isinstance(last, int) and last < len(document) and value is not DELETE:
        document[last] = copy.deepcopy(value)


def fuzzed_manifests(seed: int, count: int) -> list[tuple[dict[str, Any], list[Path_]]]:
    """``count`` manifests, each the base with one to three mutations, and the paths they touched."""
    rng = random.Random(seed)
    fields = sorted(FIELDS, key=repr)
    manifests = []
    for index in range(count):
        manifest = copy.deepcopy(BASE)
        manifest["metadata"]["name"] = f"fuzz-{index}"
        touched: list[Path_] = []
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            if rng.random() < 0.2:
                touched.append(rng.choice(SHAPES)(manifest))
            else:
                path = rng.choice(fields)
                _set(manifest, path, rng.choice(FIELDS[path]))
                touched.append(path)
        manifests.append((manifest, touched))
    return manifests


def field_names(path: Path_) -> list[str]:
    """How a refusal may name ``path`` or the object holding it: `spec.environments[0].env` (both
    sides), map keys as `.cpu` (the model) or `[cpu]` (the API server)."""
    names = []
    for end in range(len(path), 1, -1):
        prefix = admission.field_path(path[:end])
        names.append(prefix)
        if isinstance(path[end - 1], str) and end > 1:
            names.append(admission.field_path(path[: end - 1]) + f"[{path[end - 1]}]")
    return names


def names_a_field(refusal: str, touched: list[Path_]) -> bool:
    return any(name in refusal for path in touched for name in field_names(path))


def as_kubectl_sends(value: Any) -> Any:
    """``value`` as kubectl's JSON carries it: Go writes a whole-number float64 below 1e21 without a
    fraction (`3.0` as `3`), where Python's JSON keeps `3.0`, which the API server decodes as a float
    and its CEL data adapter then refuses in an integer field that a rule reads."""
    if isinstance(value, dict):
        return {key: as_kubectl_sends(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_kubectl_sends(item) for item in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    return value


def api_server_verdict(custom: client.CustomObjectsApi, namespace: str, manifest: dict[str, Any]):
    """(admitted object, None) or (None, the API server's refusal), from a dry-run create as `kubectl
    apply` sends it (server-side field validation Strict)."""
    try:
        created = custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, as_kubectl_sends(manifest), dry_run="All", field_validation="Strict"
        )
    except client.ApiException as error:
        if error.status is None or not 400 <= error.status < 500:
            raise
        try:
            return None, json.loads(error.body)["message"]
        except (TypeError, ValueError, KeyError):
            return None, str(error.body)
    return created, None


def model_verdict(manifest: dict[str, Any], path: Path):
    """(job, None) or (None, the refusal) from the model as `grpojob run` loads the file (written as
    JSON, which is YAML, so that no value changes type on the way)."""
    path.write_text(json.dumps(manifest))
    try:
        return load_job(path), None
    except UsageError as error:
        return None, str(error)


def deployment_refusals(apps: client.AppsV1Api, namespace: str, admitted: dict[str, Any]) -> list[str]:
    """The API server's refusals of the environment Deployments built from an admitted GRPOJob (dry run)."""
    job = admission.parse_job(admitted)
    refusals = []
    for env in job.spec.environments:
        deployment = build_environment_deployment(job, env, OperatorSettings(), 1)
        try:
            apps.create_namespaced_deployment(namespace, deployment, dry_run="All")
        except client.ApiException as error:
            refusals.append(f"{env.name}: {error.status} {error.body}")
    return refusals


def _differences(server: Any, model: Any, path: str = "spec") -> str:
    """Where two decoded objects differ, as `path: server value != model value` parts (an absent list
    is the model's empty one: the CRD gives lists no default)."""
    if server is None and model == []:
        return ""
    if isinstance(server, dict) and isinstance(model, dict):
        parts = [_differences(server.get(k), model.get(k), f"{path}.{k}") for k in sorted(server.keys() | model.keys())]
        return "; ".join(p for p in parts if p)
    if isinstance(server, list) and isinstance(model, list) and len(server) == len(model):
        return "; ".join(
            p for i, (a, b) in enumerate(zip(server, model, strict=True)) if (p := _differences(a, b, f"{path}[{i}]"))
        )
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (server, model))
    if numbers and float(server) == float(model):  # a number field holds floats, to float precision
        return ""
    return "" if server == model else f"{path}: {server!r} != {model!r}"


@pytest.fixture
def custom(api_client, grpojob_crd) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


def test_the_fuzzed_manifests_cover_both_verdicts():
    """The corpus is deterministic and exercises both sides (checked without a cluster)."""
    first = fuzzed_manifests(SEED, MANIFESTS)
    assert first == fuzzed_manifests(SEED, MANIFESTS)
    refused = 0
    for manifest, _ in first:
        try:
            admission.parse_job(manifest)
        except ValueError:
            refused += 1
    assert MANIFESTS / 4 < refused < MANIFESTS * 3 / 4, refused


def test_kubectl_apply_and_grpojob_run_judge_every_manifest_alike(custom, api_client, namespace, tmp_path):
    corpus = fuzzed_manifests(SEED, MANIFESTS)
    for manifest, _ in corpus:
        manifest["metadata"]["namespace"] = namespace
    with ThreadPoolExecutor(8) as pool:
        server = list(pool.map(lambda item: api_server_verdict(custom, namespace, item[0]), corpus))
    disagreements, unnamed, defaults, both_admitted = [], [], [], []
    for index, ((manifest, touched), (admitted, refusal)) in enumerate(zip(corpus, server, strict=True)):
        job, model_refusal = model_verdict(manifest, tmp_path / f"{index}.yaml")
        mutated = ", ".join(admission.field_path(p) for p in touched)
        if (admitted is None) != (job is None):
            disagreements.append(
                f"#{index} ({mutated}): API server: {refusal or 'admitted'}; model: {model_refusal or 'admitted'}"
            )
            continue
        for verdict in (refusal, model_refusal):
            if verdict is not None and not names_a_field(verdict, touched):
                unnamed.append(f"#{index} ({mutated}): {verdict}")
        if admitted is not None and job is not None:
            both_admitted.append(admitted)
            ours = admission.as_decoded(
                job.spec.model_dump(mode="json", by_alias=True), admission.job_schema()["properties"]["spec"]
            )
            if differences := _differences(admitted["spec"], ours):
                defaults.append(f"#{index} ({mutated}): {differences}")
    apps = client.AppsV1Api(api_client)
    with ThreadPoolExecutor(8) as pool:
        children = [
            r for found in pool.map(lambda a: deployment_refusals(apps, namespace, a), both_admitted) for r in found
        ]
    report = "\n".join(disagreements + unnamed + defaults + children)
    assert not disagreements, f"{len(disagreements)} verdicts differ:\n{report}"
    assert not unnamed, f"{len(unnamed)} refusals name no mutated field:\n{report}"
    assert not defaults, f"{len(defaults)} admitted specs default differently:\n{report}"
    assert not children, f"{len(children)} environment Deployments of admitted jobs refused:\n{report}"


# spec.logging beside spec.checkpointing: its cross-field rules (TensorBoard needs a claim, W&B online a key)
# and its paths, judged by both. Apart from the fuzzed corpus, whose draws a new field would reshuffle.
CHECKPOINT_CLAIM = {"claimName": "ckpt"}
WANDB_KEY = {"name": "wandb", "key": "api-key"}
LOGGING_CASES: list[tuple[dict[str, Any], dict[str, Any] | None]] = [
    ({"tensorboard": True}, None),
    ({"tensorboard": True}, {"pvc": CHECKPOINT_CLAIM}),
    ({"tensorboard": True, "pvc": {"claimName": "logs"}}, None),
    ({"tensorboard": False}, None),
    ({"tensorboard": "true", "pvc": {"claimName": "logs"}}, None),
    ({"pvc": {"claimName": "logs", "path": "a/../b"}}, None),
    ({"pvc": {"claimName": ""}}, None),
    ({"path": "../x"}, None),
    ({"path": ""}, None),
    ({"path": "grpo/logs"}, {"pvc": CHECKPOINT_CLAIM}),
    ({"mlflow": {"trackingUri": "http://mlflow:5000"}}, None),
    ({"mlflow": {"trackingUri": "http://mlflow:5000", "experiment": "", "credentialsSecret": "auth"}}, None),
    ({"mlflow": {}}, None),
    ({"wandb": {"project": "p"}}, None),
    ({"wandb": {"project": "p", "mode": "offline"}}, None),
    ({"wandb": {"project": "p", "apiKeySecret": WANDB_KEY}}, None),
    ({"wandb": {"project": "p", "mode": "sideways", "apiKeySecret": WANDB_KEY}}, None),
    ({"wandb": {"project": "", "mode": "offline"}}, None),
    ({"unknown": 1}, None),
]


def test_kubectl_apply_and_grpojob_run_judge_spec_logging_alike(custom, namespace, tmp_path):
    for index, (logging, checkpointing) in enumerate(LOGGING_CASES):
        manifest = copy.deepcopy(BASE)
        manifest["metadata"] |= {"name": f"logging-{index}", "namespace": namespace}
        manifest["spec"]["logging"] = logging
        if checkpointing is not None:
            manifest["spec"]["checkpointing"] = checkpointing
        admitted, refusal = api_server_verdict(custom, namespace, manifest)
        job, model_refusal = model_verdict(manifest, tmp_path / f"{index}.yaml")
        case = f"logging {logging}, checkpointing {checkpointing}"
        assert (admitted is None) == (job is None), f"{case}: API server {refusal}; model {model_refusal}"
        for verdict in (refusal, model_refusal):
            assert verdict is None or "logging" in verdict, f"{case}: {verdict}"


# spec.environments[].rewards: its file's three sources and its functions' rules, judged by both; the Deployment
# of each admitted one dry-run by the API server.
REWARDS_CASES: list[dict[str, Any]] = [
    {"path": "rewards/gsm8k.py", "configMap": {"name": "gsm8k-rewards"}, "functions": [{"name": "accuracy"}]},
    {"path": "gsm8k.py", "pvc": {"claimName": "data", "path": "r"}, "functions": [{"name": "a", "weight": -0.5}]},
    {"path": "/app/rewards.py", "functions": [{"builtin": "math"}, {"name": "style"}], "timeoutSeconds": 5},
    {"functions": [{"builtin": "code"}], "workers": 4, "sandbox": {"cpuSeconds": 2, "memoryMb": 128}},
    {"configMap": {"name": "m", "key": "r.py"}, "functions": [{"name": "f"}]},
    {"configMap": {"name": "m"}, "functions": [{"name": "f"}]},
    {"functions": [{"name": "accuracy"}]},
    {"path": "r.py", "functions": [{"name": "f", "builtin": "math"}]},
    {"path": "r.py", "functions": [{"weight": 2}]},
    {"path": "r.py", "functions": [{"name": "f"}, {"name": "f"}]},
    {"functions": [{"builtin": "math"}, {"builtin": "format"}, {"builtin": "math"}]},
    {"path": "r.py", "functions": []},
    {"pvc": {"claimName": "c"}, "functions": [{"builtin": "math"}]},
    {"path": "r.py", "pvc": {"claimName": "c"}, "configMap": {"name": "m"}, "functions": [{"name": "f"}]},
    {"functions": [{"builtin": "regex"}]},
    {"functions": [{"name": "not a name"}], "path": "r.py"},
    {"functions": [{"builtin": "math"}], "timeoutSeconds": 0},
    {"functions": [{"builtin": "math"}], "sandbox": {"memoryMb": 1}},
]


def test_kubectl_apply_and_grpojob_run_judge_rewards_alike(custom, api_client, namespace, tmp_path):
    apps = client.AppsV1Api(api_client)
    for index, rewards in enumerate(REWARDS_CASES):
        manifest = copy.deepcopy(BASE)
        manifest["metadata"] |= {"name": f"rewards-{index}", "namespace": namespace}
        manifest["spec"]["environments"] = [{"name": "scored", "rewards": rewards}]
        admitted, refusal = api_server_verdict(custom, namespace, manifest)
        job, model_refusal = model_verdict(manifest, tmp_path / f"{index}.yaml")
        assert (admitted is None) == (job is None), f"{rewards}: API server {refusal}; model {model_refusal}"
        for verdict in (refusal, model_refusal):
            assert verdict is None or "spec.environments[0].rewards" in verdict, f"{rewards}: {verdict}"
        if admitted is not None:
            assert not deployment_refusals(apps, namespace, admitted), rewards
    command = [{"name": "scored", "command": ["python", "x.py"], "rewards": REWARDS_CASES[0]}]
    manifest = copy.deepcopy(BASE)
    manifest["metadata"] |= {"name": "rewards-command", "namespace": namespace}
    manifest["spec"]["environments"] = command
    admitted, refusal = api_server_verdict(custom, namespace, manifest)
    assert admitted is None and "command, args and nemoGym must be unset with rewards" in str(refusal)


# Plain scalars on which YAML 1.1 (PyYAML) and kubectl's YAML (go-yaml v2) disagree, and a few on which
# they agree.
SCALARS = [
    *("1e2", "1.5e2", "2E-3", "y", "Y", "n", "N", "yes", "off", "NO", "~", "null", "0o17", "017", "0x1F", "08"),
    *("1_000", "+1", "-0", ".5", "1.", "0b101", "12:30", "2024-01-01", "2024-01-01T10:00:00Z", "abc", "'3'", '"y"'),
    # Whole floats: Go's JSON writes them below 1e21 as integers (`1e17` as 100000000000000000), above with
    # an exponent; small ones with an exponent too.
    *("1e17", "9.3e18", "1e20", "1e21", "-0.0", "2.5e-7", "1.5"),
]


def test_grpojob_run_reads_yaml_as_kubectl_does(kubeconfig, tmp_path):
    """Each scalar as the same JSON value of the same type (an integer is not a float here)."""
    document = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: scalars}\n"
    document += "".join(f"v{index}: {scalar}\n" for index, scalar in enumerate(SCALARS))
    path = tmp_path / "scalars.yaml"
    path.write_text(document)
    kubectl = build.load_components()["kubernetes"].bin_dir / "kubectl"
    command = [str(kubectl), "create", "--dry-run=client", "--validate=false", "-o", "json", "-f", str(path)]
    sent = json.loads(
        subprocess.run(command, env={"KUBECONFIG": str(kubeconfig)}, capture_output=True, text=True, check=True).stdout
    )
    ours = kubeyaml.load(document)
    keys = [f"v{index}" for index in range(len(SCALARS))]
    assert {SCALARS[i]: _typed(ours.get(k)) for i, k in enumerate(keys)} == {
        SCALARS[i]: _typed(sent.get(k)) for i, k in enumerate(keys)
    }


def _typed(value: Any) -> tuple[str, Any]:
    return type(value).__name__, value


# Numbers and quantities at the edges of how each side reads them (issue 29 item 7), outside the fuzzed corpus:
# a whole float above 2^53 that kubectl writes as an integer (admitted as one up to int64), one past int64 or
# written with an exponent (refused in an integer field), durations past int32, and zero written with a sign
# (the quantity grammar allows one; `-0` is zero, which a container's resources take).
LIMITS = (*ENV, "resources", "limits")
REQUESTS = (*ENV, "resources", "requests")
EDGES: list[tuple[Path_, Any]] = [
    *((("spec", "grpo", "seed"), v) for v in (1e17, 2.0**53 + 2, 9.2e18, 9.3e18, 1e19, 1e21, -0.0, 1.5e2)),
    *((("spec", "grpo", "maxFailedSteps"), v) for v in (1e17, 1e20)),
    *((("spec", "grpo", "rolloutTimeoutSeconds"), v) for v in (1e17, 1e21, 2.5e-7)),
    *((("spec", "activeDeadlineSeconds"), v) for v in (2**31 - 1, 2**31, 2.0**31, 1e17)),
    *((("spec", "ttlSecondsAfterFinished"), v) for v in (2**31 - 1, 2**31)),
    *((("spec", "progressDeadlineSeconds"), v) for v in (2**31 - 1, 2**31)),
    *((("spec", "dataset", "path"), v) for v in ("", "a" * 4096, "a" * 4097)),
    *(((*LIMITS, "memory"), v) for v in ("-0", "-0Gi", "+0", "-.0", "-0.0", "-0e3", "-0m", "0m", "-1", "-1Gi")),
    *(((*REQUESTS, "cpu"), v) for v in ("-0", "-0m", "-.5")),
    (REQUESTS, {"nvidia.com/gpu": "-0"}),
    (LIMITS, {"nvidia.com/gpu": "-0"}),
]


def test_kubectl_apply_and_grpojob_run_judge_numbers_and_quantities_alike(custom, namespace, tmp_path):
    """Each edge on its own (one test, one namespace: a namespace per case cost minutes)."""
    wrong = []
    for index, (path, value) in enumerate(EDGES):
        manifest = copy.deepcopy(BASE)
        manifest["metadata"] |= {"name": f"edge-{index}", "namespace": namespace}
        _set(manifest, path, value)
        if path == REQUESTS:  # a GPU request needs its limit
            _set(manifest, LIMITS, {"nvidia.com/gpu": "0"})
        elif path[: len(LIMITS)] == LIMITS:  # no request for a limit to be below
            _set(manifest, REQUESTS, {})
        admitted, refusal = api_server_verdict(custom, namespace, manifest)
        job, model_refusal = model_verdict(manifest, tmp_path / f"{index}.yaml")
        case = f"{admission.field_path(path)} = {value!r}"
        if (admitted is None) != (job is None):
            wrong.append(f"{case}: API server: {refusal or 'admitted'}; model: {model_refusal or 'admitted'}")
        wrong += [
            f"{case}: names no field: {v}" for v in (refusal, model_refusal) if v and not names_a_field(v, [path])
        ]
        if admitted is not None and job is not None:
            ours = job.spec.model_dump(mode="json", by_alias=True)
            ours = admission.as_decoded(ours, admission.job_schema()["properties"]["spec"])
            if differences := _differences(admitted["spec"], ours):
                wrong.append(f"{case}: {differences}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    "grpo",
    [
        {"maxOffPolicySteps": 1},
        {"maxOffPolicySteps": 16, "importanceSamplingCap": 5},
        {"maxOffPolicySteps": 1, "importanceSamplingCap": None},
        {"maxOffPolicySteps": 0, "importanceSamplingCap": None},
        {"maxOffPolicySteps": 17},
        {"maxOffPolicySteps": -1},
        {"maxOffPolicySteps": "1"},
    ],
)
def test_kubectl_apply_and_grpojob_run_judge_max_off_policy_steps_alike(custom, namespace, tmp_path, grpo):
    """Asynchronous GRPO's field and its rule (stale rollouts need the importance-sampling cap), outside the
    fuzzed corpus so that the corpus stays the one CI has judged."""
    manifest = copy.deepcopy(BASE)
    manifest["metadata"]["namespace"] = namespace
    manifest["spec"]["grpo"] = grpo
    admitted, refusal = api_server_verdict(custom, namespace, manifest)
    job, model_refusal = model_verdict(manifest, tmp_path / "job.yaml")
    assert (admitted is None) == (job is None), (
        f"API server: {refusal or 'admitted'}; model: {model_refusal or 'admitted'}"
    )
    for verdict in (refusal, model_refusal):
        assert verdict is None or "spec.grpo.maxOffPolicySteps" in verdict, verdict
    if job is not None:
        assert admitted["spec"]["grpo"]["maxOffPolicySteps"] == job.spec.grpo.max_off_policy_steps


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"placement": "colocated"}, None),
        ({"placement": "split", "grpo": {"maxOffPolicySteps": 1}}, None),
        ({"grpo": {"maxOffPolicySteps": 1}}, None),  # split by default: admitted
        ({"placement": "colocated", "grpo": {"maxOffPolicySteps": 1}}, "spec.grpo.maxOffPolicySteps"),
        ({"placement": "colocated", "training": {"gpusPerReplica": 2}}, "spec.training.gpusPerReplica"),
        (
            {"placement": "colocated", "generation": {"gpusPerReplica": 2}, "training": {"gpusPerReplica": 2}},
            "spec.training.gpusPerReplica",
        ),
        ({"placement": "colocated", "generation": {"gpusPerReplica": 0}}, "spec.generation.gpusPerReplica"),
        ({"placement": "colocated", "generation": {"replicas": 2}}, "spec.generation.replicas"),
        (
            {"placement": "colocated", "generation": {"gpuMemoryUtilization": 0.9}},
            "spec.generation.gpuMemoryUtilization",
        ),
        ({"generation": {"gpuMemoryUtilization": 0.9}}, None),  # split by default: the engine's GPU is its own
        ({"placement": "together"}, "spec.placement"),
        ({"training": {"resources": {"cpu": "6", "memory": "60Gi", "sharedMemory": "16Gi"}}}, None),
        ({"training": {"resources": {"memory": "8Gi", "sharedMemory": "16Gi"}}}, "sharedMemory"),
        ({"generation": {"resources": {"cpu": "lots"}}}, "spec.generation.resources.cpu"),
    ],
)
def test_kubectl_apply_and_grpojob_run_judge_placement_and_worker_resources_alike(
    custom, namespace, tmp_path, overrides, named
):
    """A colocated placement that cannot work is refused by both, naming the field that stops it; worker pod
    resources are quantities, shared memory within memory."""
    manifest = copy.deepcopy(BASE)
    manifest["metadata"]["namespace"] = namespace
    for section, value in overrides.items():
        current = manifest["spec"].get(section)
        manifest["spec"][section] = {**current, **value} if isinstance(current, dict) else value
    admitted, refusal = api_server_verdict(custom, namespace, manifest)
    job, model_refusal = model_verdict(manifest, tmp_path / "job.yaml")
    verdicts = f"API server: {refusal or 'admitted'}; model: {model_refusal or 'admitted'}"
    assert (admitted is None) == (job is None) == (named is not None), verdicts
    for verdict in (refusal, model_refusal):
        assert verdict is None or named in verdict, verdicts
    if job is not None:
        assert admitted["spec"].get("placement") == job.spec.placement
