"""What every test run in this repository shares, the product's tests (tests/) and the test tooling's own
(testing/tests/) alike.

With ``GRPOJOB_CI=1`` (set by `.ci/run`) a test skipped for a missing setup step (root, the image
tools, the node packages, a cluster program such as Kueue, the GPU image) fails instead: CI installs all of them, so
such a skip is a broken CI.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

CI_ENV = "GRPOJOB_CI"
SETUP_SKIP_REASONS = (
    "needs root",
    "make image-tools",
    "make node-packages",
    "make cluster-binaries",
    "make gpu-image",
)
"""Words of the skips that only a machine without CI's setup may take."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get(CI_ENV) == "1":
        reason = str(report.longrepr)
        if any(words in reason for words in SETUP_SKIP_REASONS):
            report.outcome = "failed"
            report.longrepr = f"skipped in CI, where every setup step has run: {reason}"
