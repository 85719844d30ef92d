"""The config's memo: a pass over an unchanged spec renders no YAML; a changed spec renders anew."""

from __future__ import annotations

from grpojob_api.admission import parse_job
from grpojob_operator import config_cache
from grpojob_operator.children.trainer import build_config_map

from .conftest import job_body


def test_the_same_job_and_spec_get_the_same_manifest_and_a_changed_spec_a_new_one():
    job = parse_job(job_body())
    first = config_cache.config_map(job)
    assert first == build_config_map(job)
    assert config_cache.config_map(parse_job(job_body())) is first, "remembered: no second render"
    changed = job_body()
    changed["spec"]["backoffLimit"] = 3
    assert config_cache.config_map(parse_job(changed)) is not first
