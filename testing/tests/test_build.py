"""Building the pinned programs: once, however many runs ask for them at the same time."""

from __future__ import annotations

import io
import threading
from pathlib import Path

import pytest

from grpojob_testing import build


def test_two_builds_of_one_component_at_once_build_it_once_and_both_get_its_programs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # The probe (no dependencies, so no module proxy) stands in for a pinned component.
    monkeypatch.setenv("GRPOJOB_CACHE", str(tmp_path))
    monkeypatch.setattr(build, "WRAPPERS_DIR", build.TESTING_DIR)
    monkeypatch.setattr(build, "mismatches", lambda component: [])
    probe = build.Component(name="probe", module="grpojob.dev/testing/probe", version="v0.0.0", tools=(".",))
    logs = [io.StringIO(), io.StringIO()]
    results: list[Path] = []
    errors: list[BaseException] = []

    def run(log: io.StringIO) -> None:
        try:
            results.append(build.build(probe, log))
        except BaseException as error:  # reported by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(log,)) for log in logs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)

    assert errors == []
    assert results == [probe.bin_dir, probe.bin_dir]
    assert (probe.bin_dir / ".complete").exists()
    assert (probe.bin_dir / "probe").is_file()
    assert sum(log.getvalue().count("building probe") for log in logs) == 1
