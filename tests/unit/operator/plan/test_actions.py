"""An action names the child it writes by kind and name: the API writer finds the group and version by kind."""

from __future__ import annotations

from grpojob_operator import kinds
from grpojob_operator.plan.actions import Delete, Patch


def test_a_delete_and_a_patch_name_their_child_by_kind_and_name_only():
    delete = Delete("Job", "demo-trainer", "Foreground")
    assert (delete.kind, delete.name, delete.propagation) == ("Job", "demo-trainer", "Foreground")
    patch = Patch("Workload", "demo-workload", {"status": {}}, "status")
    assert (patch.kind, patch.name, patch.subresource) == ("Workload", "demo-workload", "status")
    assert kinds.of(patch.kind).collection("team-a") == "/apis/kueue.x-k8s.io/v1beta2/namespaces/team-a/workloads"
