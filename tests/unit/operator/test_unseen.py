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


def test_the_status_written_stands_in_while_the_cached_job_is_one_of_our_older_versions():
    unseen = Unseen()
    body = {"metadata": {"resourceVersion": "7"}, "status": {"phase": "Pending"}}
    unseen.wrote_status("7", {"phase": "Initializing"}, "8")
    assert unseen.job(body)["status"] == {"phase": "Initializing"}
    # A second write before the cache showed the first: the first's version is ours and older too.
    unseen.wrote_status("7", {"phase": "Running"}, "9")
    first = {"metadata": {"resourceVersion": "8"}, "status": {"phase": "Initializing"}}
    assert unseen.job(first)["status"] == {"phase": "Running"}
    caught_up = {"metadata": {"resourceVersion": "9"}, "status": {"phase": "Running"}}
    assert unseen.job(caught_up) is caught_up
    assert unseen.job(body) is body, "forgotten once the cache caught up"


def test_a_version_of_the_job_not_ours_wins_over_the_status_written():
    unseen = Unseen()
    unseen.wrote_status("7", {"phase": "Initializing"}, "8")
    edited = {"metadata": {"resourceVersion": "12"}, "spec": {"suspend": True}, "status": {"phase": "Initializing"}}
    assert unseen.job(edited) is edited


def test_the_watch_echoing_our_own_create_is_nothing_new_but_a_changed_child_is():
    unseen = Unseen()
    written = ConfigMapInfo("demo-endpoints", (("RAY_HEAD_POD_IP", "10.0.0.7"),))
    unseen.wrote_child("ConfigMap", "demo-endpoints", None, written)
    assert unseen.echoes_child("ConfigMap", ConfigMapInfo("demo-endpoints", (("RAY_HEAD_POD_IP", "10.0.0.7"),)))
    assert not unseen.echoes_child("ConfigMap", ConfigMapInfo("demo-endpoints", (("RAY_HEAD_POD_IP", "10.0.0.8"),)))
    assert not unseen.echoes_child("ConfigMap", ConfigMapInfo("demo-config", ())), "a child we did not write"


def test_the_watch_echoing_our_own_status_write_is_nothing_new_but_any_later_version_is():
    unseen = Unseen()
    assert not unseen.echoes_status({"metadata": {"resourceVersion": "8"}}), "nothing written yet"
    unseen.wrote_status("7", {"phase": "Initializing"}, "8")
    assert unseen.echoes_status({"metadata": {"resourceVersion": "8"}, "status": {"phase": "Initializing"}})
    assert not unseen.echoes_status({"metadata": {"resourceVersion": "9"}}), "someone changed the job since"
    assert not unseen.echoes_status({"metadata": {"resourceVersion": "7"}}), "the version before our write"
