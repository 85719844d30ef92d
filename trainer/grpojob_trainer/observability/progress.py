"""Publishing training progress to the GRPOJob's `<job>-config` ConfigMap, beside the config (see
`grpojob_api.progress`).

The trainer pod's ServiceAccount may get, update and patch that one ConfigMap and nothing else, so this
talks to the API server directly with the pod's token: one merge patch per step.
"""

from __future__ import annotations

import logging
import math
import os
import ssl
from pathlib import Path

import httpx

from grpojob_api import endpoints
from grpojob_api.progress import (
    MEAN_REWARD_KEY,
    EvaluationReport,
    StoppedReport,
    StopReport,
    evaluation_data,
    output_model_data,
    progress_data,
    stop_data,
    stopped_data,
)
from grpojob_trainer.observability.metrics import ProgressPublisher

log = logging.getLogger(__name__)
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ConfigMapProgressPublisher(ProgressPublisher):
    """Merge-patches ``{"step", "meanReward"}`` (and what a stop needs: `grpojob_api.progress.stop_data`) into a
    ConfigMap."""

    def __init__(self, server: str, token: str, ca_file: str | None, namespace: str, name: str) -> None:
        self.url = f"{server.rstrip('/')}/api/v1/namespaces/{namespace}/configmaps/{name}"
        self.client = httpx.Client(
            verify=ssl.create_default_context(cafile=ca_file) if ca_file else True,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/merge-patch+json"},
            timeout=10.0,
        )

    @classmethod
    def in_cluster(cls, name: str) -> ConfigMapProgressPublisher:
        """From the pod's service account, `KUBERNETES_SERVICE_HOST`/`_PORT` and `POD_NAMESPACE`."""
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        namespace = os.environ.get(endpoints.POD_NAMESPACE) or (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip()
        token = (SERVICE_ACCOUNT_DIR / "token").read_text().strip()
        return cls(f"https://{host}:{port}", token, str(SERVICE_ACCOUNT_DIR / "ca.crt"), namespace, name)

    def publish(self, step: int, mean_reward: float, stop: StopReport | None = None) -> None:
        """Best effort: a failed report is logged, never the end of training (the next step reports again). One
        patch: the step, its mean reward and, once measured, what a stop needs."""
        data: dict[str, str | None] = {MEAN_REWARD_KEY: None, **progress_data(step, mean_reward)}
        if stop is not None:
            data |= stop_data(stop)
        try:
            self.client.patch(self.url, json={"data": data}).raise_for_status()
        except httpx.HTTPError as error:
            log.warning("could not report progress of step %d to %s: %s", step, self.url, error)

    def publish_evaluation(self, last: EvaluationReport, best: EvaluationReport | None) -> None:
        """Best effort, like `publish`; an evaluation whose rollouts all failed (NaN) is not reported."""
        if not math.isfinite(last.mean_reward):
            return
        try:
            self.client.patch(self.url, json={"data": evaluation_data(last, best)}).raise_for_status()
        except httpx.HTTPError as error:
            log.warning("could not report the evaluation of step %d to %s: %s", last.step, self.url, error)

    def publish_output_model(self, path: str, step: int) -> None:
        """Best effort, like `publish`."""
        try:
            self.client.patch(self.url, json={"data": output_model_data(path, step)}).raise_for_status()
        except httpx.HTTPError as error:
            log.warning("could not report the exported model %s to %s: %s", path, self.url, error)

    def publish_stopped(self, report: StoppedReport) -> None:
        """How the attempt stopped early (a preemption, a lost worker), in the trainer pod's one line. Best effort,
        like `publish`: the pod's termination message says the same while the pod is there."""
        try:
            self.client.patch(self.url, json={"data": stopped_data(report)}).raise_for_status()
        except httpx.HTTPError as error:
            log.warning("could not report how attempt %d stopped to %s: %s", report.attempt, self.url, error)
