"""The one registry of the kinds the operator reads, watches or writes: each kind's API group, version and
plural, whether the operator watches it (every child kind, into an index per kind: `handlers`), and whether
it is namespaced. The API writer (`kube`) builds its paths from it."""

from __future__ import annotations

from dataclasses import dataclass

from grpojob_api import v1alpha1 as api


@dataclass(frozen=True)
class Kind:
    """One kind of object of the Kubernetes API."""

    kind: str
    group: str
    version: str
    plural: str
    watched: bool = False
    """A kind of the job's children, watched into a Kopf index (`handlers`)."""
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def collection(self, namespace: str = "") -> str:
        """The path of the kind's objects (in ``namespace``, for a namespaced kind)."""
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if not self.namespaced:
            return f"{prefix}/{self.plural}"
        return f"{prefix}/namespaces/{namespace}/{self.plural}"


WORKLOAD = Kind("Workload", "kueue.x-k8s.io", "v1beta2", "workloads", watched=True)

KINDS: tuple[Kind, ...] = (
    Kind("Pod", "", "v1", "pods", watched=True),
    Kind("ConfigMap", "", "v1", "configmaps", watched=True),
    Kind("Service", "", "v1", "services", watched=True),
    Kind("ServiceAccount", "", "v1", "serviceaccounts", watched=True),
    Kind("PersistentVolumeClaim", "", "v1", "persistentvolumeclaims", watched=True),
    Kind("Deployment", "apps", "v1", "deployments", watched=True),
    Kind("Job", "batch", "v1", "jobs", watched=True),
    Kind("Role", "rbac.authorization.k8s.io", "v1", "roles", watched=True),
    Kind("RoleBinding", "rbac.authorization.k8s.io", "v1", "rolebindings", watched=True),
    Kind("NetworkPolicy", "networking.k8s.io", "v1", "networkpolicies", watched=True),
    Kind("RayCluster", "ray.io", "v1", "rayclusters", watched=True),
    WORKLOAD,
    Kind(api.KIND, api.GROUP, api.VERSION, api.PLURAL),
    Kind("Event", "", "v1", "events"),
    # Kueue's cluster-scoped objects, read (never written) for a job Kueue admits.
    Kind("WorkloadPriorityClass", WORKLOAD.group, WORKLOAD.version, "workloadpriorityclasses", namespaced=False),
    Kind("ResourceFlavor", WORKLOAD.group, WORKLOAD.version, "resourceflavors", namespaced=False),
)

WATCHED: tuple[Kind, ...] = tuple(k for k in KINDS if k.watched)
"""Every kind of child the operator watches, in the order its indexes are registered."""

_BY_KIND = {k.kind: k for k in KINDS}


def of(kind: str) -> Kind:
    """The registry's entry for ``kind`` (KeyError for a kind the operator never touches)."""
    return _BY_KIND[kind]
