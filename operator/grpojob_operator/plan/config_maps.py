"""A ConfigMap the job owns follows its manifest: created, or its data made the manifest's."""

from __future__ import annotations

from typing import Any

from grpojob_operator.observe import ConfigMapInfo, Observed
from grpojob_operator.plan.actions import Action, Create, Replace


def config_map_actions(
    manifest: dict[str, Any], observed: Observed, kept: frozenset[str] = frozenset()
) -> list[Action]:
    """Create a ConfigMap, or make its data the manifest's when it differs; the keys in ``kept`` are
    another writer's (the trainer's progress in `<job>-config`) and stay as they are."""
    current: ConfigMapInfo | None = observed.get("ConfigMap", manifest["metadata"]["name"])
    if current is None:
        return [Create(manifest)]
    data = {key: value for key, value in current.as_dict().items() if key not in kept}
    if data == manifest["data"]:
        return []
    return [Replace(manifest, tuple(sorted(data.keys() - manifest["data"].keys())))]
