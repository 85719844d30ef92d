"""Stage: `<job>-endpoints` (the head pod's IP, the GCS address, the attempt), written once the head is
ready and again when the head pod or the attempt changed; the environments and the trainer read it with
envFrom."""

from __future__ import annotations

from grpojob_api.v1alpha1 import ConditionType
from grpojob_operator.children.endpoints import build_endpoints, gcs_address
from grpojob_operator.plan.conditions import set_condition
from grpojob_operator.plan.config_maps import config_map_actions
from grpojob_operator.plan.context import GO_ON, STOP, Pass


def endpoints(pass_: Pass) -> bool:
    """Publish the endpoints of the ready head (``pass_.head``) into ``pass_.endpoints`` and the ConfigMap."""
    job, status, settings, head = pass_.job, pass_.status, pass_.settings, pass_.head
    if head is None:  # the Ray head stage goes on only with one
        return STOP
    status.attempt = max(status.attempt, 1)
    manifest = build_endpoints(job, settings, head.ip or "", status.attempt)
    pass_.plan.actions += config_map_actions(manifest, pass_.observed)
    pass_.endpoints = manifest["data"]
    status.gcs_address = gcs_address(job, settings)
    message = f"{pass_.child.endpoints}: GCS {status.gcs_address}, head pod IP {head.ip}"
    set_condition(status, ConditionType.ENDPOINTS_PUBLISHED, True, "EndpointsPublished", message, pass_.now)
    return GO_ON
