"""The operator's own writes stand in for the watch caches until the caches show them (or anything newer)."""

from __future__ import annotations

from grpojob_operator.expectations import Expectations
from grpojob_operator.observe import ConfigMapInfo, Observed, OtherInfo, TrainerJobInfo


def test_a_created_child_is_seen_until_the_cache_has_it_then_the_cache_wins():
    expectations = Expectations()
    expectations.wrote_child("ConfigMap", "demo-endpoints", None, ConfigMapInfo("demo-endpoints", (("A", "1"),)))
    assert expectations.observed(Observed({})).has("ConfigMap", "demo-endpoints"), "no second create"
    cached = Observed({"ConfigMap": {"demo-endpoints": ConfigMapInfo("demo-endpoints", (("A", "2"),))}})
    assert expectations.observed(cached).get("ConfigMap", "demo-endpoints").as_dict() == {"A": "2"}
    assert expectations.observed(Observed({})).children.get("ConfigMap", {}) == {}, "forgotten once the cache moved"


def test_a_deleted_child_is_seen_as_being_deleted_or_gone():
    expectations = Expectations()
    trainer = TrainerJobInfo("demo-trainer", 1, False, True, "", False)
    expectations.deleted_child("Job", "demo-trainer", trainer)
    expectations.deleted_child("Service", "demo-env-a", OtherInfo("demo-env-a", False))
    expectations.deleted_child("ConfigMap", "demo-endpoints", ConfigMapInfo("demo-endpoints", ()))
    cached = Observed(
        {
            "Job": {"demo-trainer": trainer},
            "Service": {"demo-env-a": OtherInfo("demo-env-a", False)},
            "ConfigMap": {"demo-endpoints": ConfigMapInfo("demo-endpoints", ())},
        }
    )
    seen = expectations.observed(cached)
    assert seen.get("Job", "demo-trainer").deleting and seen.get("Service", "demo-env-a").deleting
    assert not seen.has("ConfigMap", "demo-endpoints")


def test_the_status_written_stands_in_while_the_cached_job_is_one_of_our_older_versions():
    expectations = Expectations()
    body = {"metadata": {"resourceVersion": "7"}, "status": {"phase": "Pending"}}
    expectations.wrote_status("7", {"phase": "Initializing"}, "8")
    assert expectations.job(body)["status"] == {"phase": "Initializing"}
    # A second write before the cache showed the first: the first's version is ours and older too.
    expectations.wrote_status("7", {"phase": "Running"}, "9")
    first = {"metadata": {"resourceVersion": "8"}, "status": {"phase": "Initializing"}}
    assert expectations.job(first)["status"] == {"phase": "Running"}
    caught_up = {"metadata": {"resourceVersion": "9"}, "status": {"phase": "Running"}}
    assert expectations.job(caught_up) is caught_up
    assert expectations.job(body) is body, "forgotten once the cache caught up"


def test_a_version_of_the_job_not_ours_wins_over_the_status_written():
    expectations = Expectations()
    expectations.wrote_status("7", {"phase": "Initializing"}, "8")
    edited = {"metadata": {"resourceVersion": "12"}, "spec": {"suspend": True}, "status": {"phase": "Initializing"}}
    assert expectations.job(edited) is edited


def test_the_watch_echoing_our_own_create_is_nothing_new_but_a_changed_child_is():
    expectations = Expectations()
    written = ConfigMapInfo("demo-endpoints", (("RAY_HEAD_POD_IP", "10.0.0.7"),))
    expectations.wrote_child("ConfigMap", "demo-endpoints", None, written)
    assert expectations.echoes_child("ConfigMap", ConfigMapInfo("demo-endpoints", (("RAY_HEAD_POD_IP", "10.0.0.7"),)))
    assert not expectations.echoes_child(
        "ConfigMap", ConfigMapInfo("demo-endpoints", (("RAY_HEAD_POD_IP", "10.0.0.8"),))
    )
    assert not expectations.echoes_child("ConfigMap", ConfigMapInfo("demo-config", ())), "a child we did not write"


def test_the_watch_echoing_our_own_status_write_is_nothing_new_but_any_later_version_is():
    expectations = Expectations()
    assert not expectations.echoes_status({"metadata": {"resourceVersion": "8"}}), "nothing written yet"
    expectations.wrote_status("7", {"phase": "Initializing"}, "8")
    assert expectations.echoes_status({"metadata": {"resourceVersion": "8"}, "status": {"phase": "Initializing"}})
    assert not expectations.echoes_status({"metadata": {"resourceVersion": "9"}}), "someone changed the job since"
    assert not expectations.echoes_status({"metadata": {"resourceVersion": "7"}}), "the version before our write"
