"""What a reconcile pass sees of a job's children."""

from __future__ import annotations

from grpojob_operator.handlers import WATCHED_CHILDREN, index_id, observed_from_indexes
from grpojob_operator.observe import OtherInfo


def test_children_of_an_earlier_job_with_the_same_name_are_ignored():
    indexes = {index_id(kind): {} for kind, *_ in WATCHED_CHILDREN}
    indexes[index_id("Service")] = {
        ("ns", "demo", "uid-old"): [OtherInfo("demo-generation", True)],
        ("ns", "demo", "uid-new"): [OtherInfo("demo-env-math", False)],
    }
    observed = observed_from_indexes(indexes, "ns", "demo", "uid-new")
    assert observed.has("Service", "demo-env-math")
    assert not observed.has("Service", "demo-generation")
