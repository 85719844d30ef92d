"""GRPOJobs for the real GPU node (`tests/gpu/test_e2e_gpu.py`, `benchmarks/cluster_vs_local.py`): kubectl
against that cluster, a claim bound to a host directory holding a random-init model and the arithmetic
dataset, the job's manifest, and the same job for `grpojob run` on the same machine."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DATA_CLAIM = "grpo-data"


def kubectl_program() -> str:
    """The pinned kubectl of the cluster's programs, else the one on PATH."""
    from grpojob_testing import build

    pinned = build.load_components()["kubernetes"].bin_dir / "kubectl"
    return str(pinned) if pinned.exists() else shutil.which("kubectl") or "kubectl"


@dataclass
class Kube:
    """kubectl with one kubeconfig."""

    kubeconfig: Path

    def run(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        done = subprocess.run(
            [kubectl_program(), f"--kubeconfig={self.kubeconfig}", *args], input=stdin, capture_output=True, text=True
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def json(self, *args: str) -> dict[str, Any]:
        return json.loads(self.run(*args, "-o", "json"))


def trainer_environment() -> dict[str, str]:
    """This process's environment with the repository's packages importable."""
    paths = [str(REPO / p) for p in ("api", "operator", "trainer")] + sys.path
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def write_model_and_data(host_dir: Path, shape: str, rows: int) -> None:
    """``host_dir/model`` (random weights of ``shape``) and ``host_dir/train.jsonl`` (the arithmetic task)."""
    python = [sys.executable, "-m"]
    env = trainer_environment()
    subprocess.run(
        [*python, "grpojob_trainer.cli", "tiny-model", str(host_dir / "model"), "--shape", shape], env=env, check=True
    )
    subprocess.run(
        [
            *python,
            "grpojob_trainer.environments.dataset",
            "arithmetic",
            "--rows",
            str(rows),
            "--out",
            str(host_dir / "train.jsonl"),
        ],
        env=env,
        check=True,
    )


def data_claim(kube: Kube, namespace: str, shape: str, rows: int) -> Path:
    """A claim ``grpo-data`` bound to a host directory holding ``model/`` (random weights of ``shape``) and
    ``train.jsonl``, written here rather than by a pod (a 7B model is 15 GB); returns the directory."""
    host_dir = Path(tempfile.mkdtemp(prefix=f"grpojob-gpu-e2e-{namespace}-", dir="/var/tmp"))
    host_dir.chmod(0o777)  # the pods run as UID 1000
    write_model_and_data(host_dir, shape, rows)
    subprocess.run(["chmod", "-R", "a+rwX", str(host_dir)], check=True)
    volume = f"{DATA_CLAIM}-{namespace}"
    objects = [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": "100Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(host_dir), "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": DATA_CLAIM},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": DATA_CLAIM, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": "100Gi"}},
            },
        },
    ]
    kube.run("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    return host_dir


def grpo_job(
    name: str, *, steps: int, learning_rate: float, placement: str, lora_rank: int = 0, memory: str | None = None
) -> dict[str, Any]:
    """The arithmetic task on the claim, vLLM generating, one GPU per engine and per policy rank; ``memory``
    of each worker pod where the default (24Gi a GPU, for a one-GPU 32 GiB node) is too little."""
    training: dict[str, Any] = {"gpusPerReplica": 1, "microBatchSize": 16, "optimizer": {"learningRate": learning_rate}}
    if memory:
        training["resources"] = {"memory": memory}
    if lora_rank:
        training["lora"] = {"rank": lora_rank, "alpha": 2 * lora_rank}
    claim = {"claimName": DATA_CLAIM}
    return {
        "apiVersion": "grpo.dev/v1alpha1",
        "kind": "GRPOJob",
        "metadata": {"name": name},
        "spec": {
            "placement": placement,
            "model": {"path": "model", "pvc": claim, "servedModelName": "policy"},
            "dataset": {"path": "train.jsonl", "pvc": claim},
            "environments": [{"name": "arithmetic", "args": ["arithmetic"]}],
            "generation": {
                "backend": "vllm",
                "gpusPerReplica": 1,
                "gpuMemoryUtilization": 0.35 if placement == "colocated" else 0.85,
                # Short answers, as examples/tiny-gpu.yaml: the arithmetic reward's partial credit (digits) is what
                # a randomly initialised policy can learn in a few steps.
                "maxModelLen": 256,
                "maxNewTokens": 8,
            },
            "training": training,
            "grpo": {"promptsPerStep": 32, "generationsPerPrompt": 8, "maxSteps": steps},
            "checkpointing": {"pvc": claim, "path": "checkpoints", "interval": steps},
            "output": {"pvc": claim, "path": f"models/{name}"} | ({"format": "adapter"} if lora_rank else {}),
        },
    }


def local_job(job: dict[str, Any], host_dir: Path) -> dict[str, Any]:
    """``job`` for `grpojob run` on this machine: every path on the claim becomes the same path under
    ``host_dir``, and the worker pods' resources (Kubernetes requests) are dropped."""
    local = copy.deepcopy(job)
    spec = local["spec"]
    for part in ("model", "dataset", "checkpointing", "output"):
        if spec[part].pop("pvc", None) is not None:
            spec[part]["path"] = str(host_dir / spec[part]["path"])
    spec["training"].pop("resources", None)
    return local
