"""The job's `<job>-config` ConfigMap, remembered per job and spec: rendering the config as YAML is nine
tenths of a pass that changes nothing (PyYAML is pure Python), and passes run every few seconds per job.
The plan is pure; the handlers hand it `config_map` in place of `children.trainer.build_config_map`."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from grpojob_api import v1alpha1 as api
from grpojob_operator.children.trainer import build_config_map

_CONFIG_MAPS: OrderedDict[tuple[str, ...], dict[str, Any]] = OrderedDict()
_CONFIG_MAPS_LOCK = threading.Lock()
_CONFIG_MAPS_KEPT = 4096


def config_map(job: api.GRPOJob) -> dict[str, Any]:
    """`children.trainer.build_config_map`, remembered (the last 4096 jobs and specs). The manifest returned is
    shared: never change it."""
    meta = job.metadata
    key = (meta.uid or "", meta.namespace or "", meta.name, job.spec.model_dump_json())
    with _CONFIG_MAPS_LOCK:
        known = _CONFIG_MAPS.get(key)
        if known is not None:
            _CONFIG_MAPS.move_to_end(key)
            return known
    manifest = build_config_map(job)
    with _CONFIG_MAPS_LOCK:
        _CONFIG_MAPS[key] = manifest
        while len(_CONFIG_MAPS) > _CONFIG_MAPS_KEPT:
            _CONFIG_MAPS.popitem(last=False)
    return manifest
