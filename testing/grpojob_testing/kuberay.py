"""How the test clusters run the KubeRay operator: its arguments, the same for the loopback control plane
(`grpojob_testing.cluster`) and the kind cluster (`grpojob_testing.kind`)."""

from __future__ import annotations

RECONCILE_CONCURRENCY = 16
"""RayClusters KubeRay reconciles at once (`--reconcile-concurrency`; its chart's `reconcileConcurrency`,
default 1). One worker turned heads ready at 0.1-1.4 a second in the 1,000-job benchmark and left 297
RayClusters without a state once every head pod was Ready. At 64 (our operator's `reconcile_workers`) KubeRay
was slower here, not faster: 100 RayJobs reached their submitter Job at p50 18.9 s against 12.1 s at 16, with
2.5 times as many status writes. So the benchmark's anchor runs KubeRay at the faster of the two."""


def operator_args(health_address: str, metrics_address: str) -> list[str]:
    """The KubeRay operator's command-line arguments (no leader election: one replica in a test cluster)."""
    return [
        f"--health-probe-bind-address={health_address}",
        f"--metrics-addr={metrics_address}",
        "--enable-leader-election=false",
        "--log-stdout-encoder=console",
        f"--reconcile-concurrency={RECONCILE_CONCURRENCY}",
    ]
