"""How the test clusters run the KubeRay operator: its arguments, the same for the loopback control plane
(`grpojob_testing.cluster`) and the kind cluster (`grpojob_testing.kind`)."""

from __future__ import annotations

RECONCILE_CONCURRENCY = 16
"""RayClusters KubeRay reconciles at once (`--reconcile-concurrency`; its chart's `reconcileConcurrency`,
default 1). One worker turned heads ready at 0.1-1.4 a second in the 1,000-job benchmark and left 297
RayClusters without a state once every head pod was Ready; 16 is what our operator runs
(`reconcile_workers`), so a benchmark against RayJob compares the controllers' work, not their queues."""


def operator_args(health_address: str, metrics_address: str) -> list[str]:
    """The KubeRay operator's command-line arguments (no leader election: one replica in a test cluster)."""
    return [
        f"--health-probe-bind-address={health_address}",
        f"--metrics-addr={metrics_address}",
        "--enable-leader-election=false",
        "--log-stdout-encoder=console",
        f"--reconcile-concurrency={RECONCILE_CONCURRENCY}",
    ]
