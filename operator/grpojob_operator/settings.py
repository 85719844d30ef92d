"""Operator settings, from command-line flags or `GRPOJOB_*` environment variables (flags win)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from grpojob_api import nemo_gym

DEFAULT_RAY_IMAGE = "ghcr.io/grpojob/trainer:0.1.0"
DEFAULT_ENVIRONMENT_IMAGE = "ghcr.io/grpojob/environments:0.1.0"
DEFAULT_NEMO_GYM_IMAGE = nemo_gym.DEFAULT_IMAGE
RAY_VERSION = "2.60.0"


class OperatorSettings(BaseModel):
    """Everything the operator needs to know that is not in a GRPOJob."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty watches the whole cluster."""
    cluster_domain: str = "cluster.local"
    """DNS suffix of Services, used in the addresses published in `<job>-endpoints`."""
    ray_image: str = DEFAULT_RAY_IMAGE
    """Default image of Ray pods (and of the trainer, unless set separately)."""
    trainer_image: str | None = None
    """Default image of the trainer Job (defaults to `ray_image`)."""
    environment_image: str = DEFAULT_ENVIRONMENT_IMAGE
    """Default image of environment servers."""
    nemo_gym_image: str = DEFAULT_NEMO_GYM_IMAGE
    """Default image of NeMo Gym environments (`spec.environments[].nemoGym`): nemo-gym with every server's
    virtual environment prepared, on the Python and Ray versions of `ray_image`."""
    ray_version: str = RAY_VERSION
    """Ray version declared in every RayCluster; must match the images."""
    log_level: str = "INFO"
    metrics_port: int = Field(default=8080, ge=0, le=65535)
    """Port of the Prometheus metrics endpoint (0 disables it)."""
    probe_port: int = Field(default=8081, ge=0, le=65535)
    """Port of the liveness endpoint `/healthz` (0 disables it)."""
    reconcile_interval_seconds: float = Field(default=10.0, gt=0)
    """Longest time between two reconcile passes of a job. A change of the job or of any of its children
    starts a pass at once; this interval catches what no event announces (deadlines, grace periods,
    TTLs). Reads come from watch caches, so a pass costs no API call unless something must change."""
    reconcile_workers: int = Field(default=64, ge=1, le=256)
    """Reconcile passes that may run at once (threads; twice as many for the writes they send at once, and
    three times as many API connections). A pass spends most of its time waiting for the API server's answers,
    so many more than the cores: at 16, 100 jobs created at once queued 76 passes behind the ones waiting on
    their creates, and a ready head waited 4 s for its pass (`benchmarks/operator_scale.py`)."""
    pod_failure_grace_seconds: float = Field(default=120.0, ge=0)
    """How long a child pod may sit in ImagePullBackOff, ErrImagePull or CrashLoopBackOff before the job
    fails."""
    build_tries: int = Field(default=5, ge=1, le=100)
    """Reconcile passes in a row (with backoff between them) that may fail to build a job's children before the
    job fails with reason BuildFailed: a spec the API admits but a builder refuses never loops for ever."""
    leader_election_namespace: str | None = None
    """Namespace of the Lease that elects the one replica that reconciles (the chart sets its own namespace);
    unset, this process reconciles at once and alone."""
    leader_election_lease: str = "grpojob-operator"
    """Name of that Lease."""
    lease_duration_seconds: float = Field(default=15.0, gt=0)
    """How long a standby waits, after the leader's last renewal, before it takes over. The leader renews every
    third of it and exits if it could not renew for two thirds of it, before any standby may take over."""
    exit_after_writes: int | None = Field(default=None, ge=1)
    """Fault injection for tests: exit abruptly right after this many API writes, as if killed."""

    def default_trainer_image(self) -> str:
        return self.trainer_image or self.ray_image


_ENV_PREFIX = "GRPOJOB_"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def load_settings(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> OperatorSettings:
    """Settings from flags (``--cluster-domain x``, ``--namespace a --namespace b``) over environment
    variables (``GRPOJOB_CLUSTER_DOMAIN``, ``GRPOJOB_NAMESPACES=a,b``) over defaults."""
    environ = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for name in OperatorSettings.model_fields:
        raw = environ.get(_ENV_PREFIX + name.upper())
        if raw:
            values[name] = tuple(n for n in raw.split(",") if n) if name == "namespaces" else raw
    parser = argparse.ArgumentParser(prog="python -m grpojob_operator", description="The GRPOJob operator.")
    for name, field in OperatorSettings.model_fields.items():
        if name == "namespaces":
            parser.add_argument("--namespace", dest="namespaces", action="append", help=field.description)
        else:
            parser.add_argument(_flag(name), dest=name, help=field.description)
    parsed = parser.parse_args(list(argv or []))
    values.update({k: (tuple(v) if k == "namespaces" else v) for k, v in vars(parsed).items() if v is not None})
    return OperatorSettings.model_validate(values)
