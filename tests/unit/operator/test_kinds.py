"""The registry of kinds: what the handlers watch and where the API writer writes, from one table."""

from __future__ import annotations

import pytest
import yaml

from grpojob_api import v1alpha1 as api
from grpojob_operator import kinds

from .test_golden_children import GOLDEN


def test_every_kind_of_child_the_builders_make_is_watched_and_has_its_api_version():
    built = set()
    for path in GOLDEN.glob("*.yaml"):
        built |= {(child["kind"], child["apiVersion"]) for child in yaml.safe_load_all(path.read_text())}
    assert {(k.kind, k.api_version) for k in kinds.WATCHED} >= built


def test_the_operator_watches_pods_and_every_child_kind_but_not_the_job_events_or_kueue_cluster_objects():
    watched = [k.kind for k in kinds.WATCHED]
    assert watched[0] == "Pod" and "Workload" in watched
    assert not {api.KIND, "Event", "WorkloadPriorityClass", "ResourceFlavor"} & set(watched)


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("ConfigMap", "/api/v1/namespaces/rl/configmaps"),
        ("RayCluster", "/apis/ray.io/v1/namespaces/rl/rayclusters"),
        (api.KIND, f"/apis/{api.GROUP}/{api.VERSION}/namespaces/rl/{api.PLURAL}"),
        ("ResourceFlavor", "/apis/kueue.x-k8s.io/v1beta2/resourceflavors"),
    ],
)
def test_paths_of_namespaced_and_cluster_scoped_kinds(kind, path):
    assert kinds.of(kind).collection("rl") == path


def test_a_kind_the_operator_never_touches_is_not_in_the_registry():
    with pytest.raises(KeyError):
        kinds.of("Secret")
