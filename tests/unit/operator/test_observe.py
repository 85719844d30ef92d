"""The summaries of watched children hold what the plan reads, and nothing more: a change of anything
else leaves the summary equal, so the pass it would wake is skipped."""

from __future__ import annotations

from grpojob_operator.observe import summarize


def raycluster(ready_workers: int, head_ready: bool = True) -> dict:
    return {
        "metadata": {"name": "demo"},
        "spec": {"workerGroupSpecs": [{"groupName": "policy", "replicas": 3}]},
        "status": {
            "readyWorkerReplicas": ready_workers,
            "conditions": [{"type": "HeadPodReady", "status": "True" if head_ready else "False"}],
        },
    }


def test_a_ray_worker_becoming_ready_leaves_the_raycluster_summary_equal():
    assert summarize("RayCluster", raycluster(0)) == summarize("RayCluster", raycluster(3))
    assert summarize("RayCluster", raycluster(3)) != summarize("RayCluster", raycluster(3, head_ready=False))
