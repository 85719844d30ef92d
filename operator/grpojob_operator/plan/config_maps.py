"""A ConfigMap the job owns follows its manifest: created, or its data made the manifest's."""

from __future__ import annotations

from typing import Any

from grpojob_operator.observe import ConfigMapInfo, Observed
from grpojob_operator.plan.actions import Action, Create, Replace


def config_map_actions(manifest: dict[str, Any], observed: Observed) -> list[Action]:
    """Create a ConfigMap, or make its data the manifest's when it differs."""
    current: ConfigMapInfo | None = observed.get("ConfigMap", manifest["metadata"]["name"])
    if current is None:
        return [Create(manifest)]
    data = current.as_dict()
    if data == manifest["data"]:
        return []
    return [Replace(manifest, tuple(sorted(data.keys() - manifest["data"].keys())))]
