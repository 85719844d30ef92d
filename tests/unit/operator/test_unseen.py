"""The operator's own writes stand in for the watch caches until the caches show them (or anything newer)."""

from __future__ import annotations

from grpojob_operator.observe import ConfigMapInfo, Observed, OtherInfo, TrainerJobInfo
from grpojob_operator.unseen import Unseen


def test_a_created_child_is_seen_until_the_cache_has_it_then_the_cache_wins():
    unseen = Unseen()
    unseen.wrote_child("ConfigMap", "demo-endpoints", None, ConfigMapInfo("demo-endpoints", (("A", "1"),)))
    assert unseen.observed(Observed({})).has("ConfigMap", "demo-endpoints"), "no second create"
    cached = Observed({"ConfigMap": {"demo-endpoints": ConfigMapInfo("demo-endpoints", (("A", "2"),))}})
    assert unseen.observed(cached).get("ConfigMap", "demo-endpoints").as_dict() == {"A": "2"}
    assert unseen.observed(Observed({})).children.get("ConfigMap", {}) == {}, "forgotten once the cache moved"


def test_a_deleted_child_is_seen_as_being_deleted_or_gone():
    unseen = Unseen()
    trainer = TrainerJobInfo("demo-trainer", 1, False, True, "", False)
    unseen.deleted_child("Job", "demo-trainer", trainer)
    unseen.deleted_child("Service", "demo-env-a", OtherInfo("demo-env-a", False))
    unseen.deleted_child("ConfigMap", "demo-endpoints", ConfigMapInfo("demo-endpoints", ()))
    cached = Observed(
        {
            "Job": {"demo-trainer": trainer},
            "Service": {"demo-env-a": OtherInfo("demo-env-a", False)},
            "ConfigMap": {"demo-endpoints": ConfigMapInfo("demo-endpoints", ())},
        }
    )
    seen = unseen.observed(cached)
    assert seen.get("Job", "demo-trainer").deleting and seen.get("Service", "demo-env-a").deleting
    assert not seen.has("ConfigMap", "demo-endpoints")


def test_the_status_written_stands_in_while_the_cached_job_is_the_version_it_was_computed_from():
    unseen = Unseen()
    body = {"metadata": {"resourceVersion": "7"}, "status": {"phase": "Pending"}}
    unseen.wrote_status("7", {"phase": "Initializing"})
    assert unseen.job(body)["status"] == {"phase": "Initializing"}
    newer = {"metadata": {"resourceVersion": "8"}, "status": {"phase": "Initializing"}}
    assert unseen.job(newer) is newer
    assert unseen.job(body) is body, "forgotten once the cache moved"
