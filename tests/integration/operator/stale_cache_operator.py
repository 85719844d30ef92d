"""`python -m grpojob_operator`, with one child deleted between the operator's read and its write.

The first time the operator merge-patches a child ConfigMap (the endpoints, after the Ray head was
replaced), the ConfigMap is deleted through the API right before the patch is sent: the operator's watch
cache still shows it, the API answers 404. Used by test_resilience.py; nothing else changes."""

from __future__ import annotations

import sys
from typing import Any

from kubernetes import client

from grpojob_operator import kube
from grpojob_operator.__main__ import main

_replace_data = kube.Kube.replace_data
_done: list[str] = []


def replace_data_of_a_deleted_config_map(self: kube.Kube, manifest: dict[str, Any], stale_keys: tuple = ()) -> None:
    meta = manifest["metadata"]
    if not _done:
        client.CoreV1Api(self.api).delete_namespaced_config_map(meta["name"], meta["namespace"])
        _done.append(meta["name"])
        print(f"stale-cache fault: deleted ConfigMap {meta['name']} before patching it", file=sys.stderr, flush=True)
    _replace_data(self, manifest, stale_keys)


kube.Kube.replace_data = replace_data_of_a_deleted_config_map  # type: ignore[method-assign]

if __name__ == "__main__":
    main()
