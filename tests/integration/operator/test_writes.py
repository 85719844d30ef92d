"""The operator is a good citizen of a busy control plane: a job reaches Running in a small, counted
number of API writes (operator and Kopf together), and a job where nothing changes costs none."""

from __future__ import annotations

from collections import Counter

import pytest
from kubernetes.dynamic import DynamicClient
from prometheus_client.parser import text_string_to_metric_families

from grpojob_operator import kinds

from .conftest import job_manifest, sleep_passes

pytestmark = pytest.mark.integration

WRITES_BEYOND_CREATING_THE_CHILDREN = 4
"""The write budget of one job from create to Running, beyond one create per child: every status patch and
Event (the finalizer is gone). With today's 11 children that is 15 writes in all (issue 15's budget); a
new child adds its one create. (The job here names its model by path: a hub id would add two children, its
cache claim and download Job, and the status write of the download's end.)"""


def writes(operator) -> Counter:
    """The operator's `grpojob_api_writes_total`, by (verb, kind)."""
    found: Counter = Counter()
    for family in text_string_to_metric_families(operator.metrics()):
        for sample in family.samples:
            if sample.name == "grpojob_api_writes_total":
                found[(sample.labels["verb"], sample.labels["kind"])] += int(sample.value)
    return found


def owned_children(jobs, name: str) -> list[tuple[str, str]]:
    """(kind, name) of every object whose ownerReference is the GRPOJob, of every kind the operator watches."""
    uid = jobs.get(name)["metadata"]["uid"]
    dynamic = DynamicClient(jobs.core.api_client)
    found = []
    for kind in kinds.WATCHED:
        if kind.kind == "Pod":
            continue
        resource = dynamic.resources.get(api_version=kind.api_version, kind=kind.kind)
        for item in resource.get(namespace=jobs.namespace).to_dict()["items"]:
            owners = item["metadata"].get("ownerReferences") or []
            if any(o.get("uid") == uid for o in owners):
                found.append((kind.kind, item["metadata"]["name"]))
    return sorted(found)


def test_a_job_reaches_running_within_the_write_budget_and_then_writes_nothing(operator, jobs):
    jobs.create(job_manifest("thrifty"))
    jobs.wait_phase("thrifty", "Running")
    sleep_passes(6)  # whatever trails Running (an environment's readiness) is written by now
    lifecycle = writes(operator)

    children = owned_children(jobs, "thrifty")
    creates = sum(n for (verb, kind), n in lifecycle.items() if verb == "POST" and kind != "Event")
    beyond = sum(lifecycle.values()) - creates
    assert creates == len(children), f"each child created once: {lifecycle} for {children}"
    assert beyond <= WRITES_BEYOND_CREATING_THE_CHILDREN, (
        f"{dict(lifecycle)} for {len(children)} children; the operator's status writes:\n"
        + "\n".join(line for line in operator.log().splitlines() if ": status " in line)
    )
    assert sum(lifecycle.values()) <= len(children) + WRITES_BEYOND_CREATING_THE_CHILDREN

    # Kopf wrote nothing: no finalizer, none of its annotations, no field of the job managed by it.
    meta = jobs.get("thrifty")["metadata"]
    assert not meta.get("finalizers"), meta.get("finalizers")
    assert not [k for k in meta.get("annotations") or {} if "kopf" in k]
    assert not [f["manager"] for f in meta.get("managedFields", []) if "kopf" in f["manager"].lower()]
    # Its Events are the operator's own (one per phase change, counted above).
    assert len(jobs.events("thrifty")) == lifecycle[("POST", "Event")]

    # A running job whose trainer reports nothing new makes no write at all, pass after pass.
    sleep_passes(20)
    assert writes(operator) == lifecycle
