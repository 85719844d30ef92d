"""The chart as rendered by `helm template` (no cluster): safe pods, names within limits, RBAC by
mode, every value documented. Helm is the pinned one the test tooling builds."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpojob_api.admission import parse_job
from grpojob_operator.children.trainer import build_trainer_job
from grpojob_operator.settings import DEFAULT_ENVIRONMENT_IMAGE, DEFAULT_RAY_IMAGE, OperatorSettings
from grpojob_testing import build
from tests.unit.operator.conftest import job_body

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "grpojob"
LONG_RELEASE = "a-release-name-as-long-as-helm-allows-53-characters-x"  # Helm allows 53
LONG_NAMESPACE = "n" * 63


@pytest.fixture(scope="module")
def helm() -> Path:
    return build.build(build.load_components()["helm"]) / "helm"


def render(helm: Path, *flags: str, release: str = "rel", namespace: str = "ops") -> list[dict[str, Any]]:
    home = Path(tempfile.gettempdir()) / "grpojob-helm-home"
    result = subprocess.run(
        [str(helm), "template", release, str(CHART), "--namespace", namespace, *flags],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


VARIANTS = {
    "defaults": (),
    "namespaced": ("--set", "operator.watchNamespaces={team-a,team-b}"),
    "monitored": ("--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.trainerPodMonitor.enabled=true"),
    "long-names": ("--set", "fullnameOverride=" + "f" * 70, "--set", "operator.watchNamespaces={" + "w" * 63 + "}"),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_pod_is_non_root_read_only_and_drops_every_capability(helm: Path, variant: str):
    objects = render(helm, *VARIANTS[variant], release=LONG_RELEASE if variant == "long-names" else "rel")
    pods = [o["spec"]["template"]["spec"] for o in objects if o["kind"] in ("Deployment", "Job", "DaemonSet")]
    assert pods
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
        for container in pod["containers"] + pod.get("initContainers", []):
            context = container["securityContext"]
            assert context["runAsNonRoot"] is True
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context.get("privileged", False) is False
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}
            assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_names_fit_in_63_characters_and_nothing_secret_is_rendered(helm: Path, variant: str):
    objects = render(helm, *VARIANTS[variant], release=LONG_RELEASE, namespace=LONG_NAMESPACE)
    for o in objects:
        assert len(o["metadata"]["name"]) <= 63, o["metadata"]["name"]
        for value in (o["metadata"].get("labels") or {}).values():
            assert len(value) <= 63, value
    assert not by_kind(objects, "Secret") and not by_kind(objects, "ConfigMap")
    for kind in ("ClusterRole", "ClusterRoleBinding"):
        names = [o["metadata"]["name"] for o in by_kind(objects, kind)]
        assert len(names) == len(set(names)), names
    (deployment,) = by_kind(objects, "Deployment")
    for env in deployment["spec"]["template"]["spec"]["containers"][0]["env"]:
        assert not re.search(r"token|password|secret|key", env["name"], re.IGNORECASE), env


def test_the_operator_deployment_is_two_replicas_with_a_lease_probed_through_kopf(helm: Path):
    (deployment,) = by_kind(render(helm), "Deployment")
    spec = deployment["spec"]
    # Two replicas, one Lease between them (only its holder reconciles), so a rollout may overlap them.
    assert spec["replicas"] == 2 and spec["strategy"] == {"type": "RollingUpdate"}
    anti_affinity = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti_affinity["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"] == (
        "kubernetes.io/hostname"
    )
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "rel-grpojob"
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/grpojob/operator:0.1.0"
    assert "args" not in container  # cluster-wide: no --namespace
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    env = {e["name"]: e["value"] for e in container["env"]}
    # The environment variables are the operator's own settings, with its defaults.
    assert {name.removeprefix("GRPOJOB_").lower() for name in env} <= set(OperatorSettings.model_fields)
    assert env["GRPOJOB_RAY_IMAGE"] == DEFAULT_RAY_IMAGE
    assert env["GRPOJOB_ENVIRONMENT_IMAGE"] == DEFAULT_ENVIRONMENT_IMAGE
    assert env["GRPOJOB_PROBE_PORT"] == "8081" and env["GRPOJOB_METRICS_PORT"] == "8080"
    assert env["GRPOJOB_LEADER_ELECTION_NAMESPACE"] == "ops" and env["GRPOJOB_LEADER_ELECTION_LEASE"]
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    (service,) = by_kind(render(helm), "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()


def _rules(objects: list[dict[str, Any]], kind: str) -> list[list[dict[str, Any]]]:
    return [o["rules"] for o in by_kind(objects, kind)]


KUEUE_READS = {
    "apiGroups": ["kueue.x-k8s.io"],
    "resources": ["workloadpriorityclasses", "resourceflavors"],
    "verbs": ["get"],
}


def test_kueue_rights_are_its_workloads_and_reads_of_its_setup_and_go_with_kueue_enabled_false(helm: Path):
    (rules,) = [o["rules"] for o in by_kind(render(helm), "ClusterRole") if o["metadata"]["name"] == "rel-grpojob-ops"]
    kueue = [rule for rule in rules if rule["apiGroups"] == ["kueue.x-k8s.io"]]
    assert kueue == [
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["list", "watch", "create", "delete"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads/status"], "verbs": ["patch"]},
    ]
    without = render(helm, "--set", "kueue.enabled=false")
    assert not [o for o in without if o["metadata"]["name"].endswith("-kueue")]
    assert "kueue.x-k8s.io" not in json.dumps(by_kind(without, "ClusterRole"))


def test_cluster_wide_rbac_is_one_cluster_role_bound_to_the_operator(helm: Path):
    objects = render(helm)
    _assert_only_the_leader_lease(objects)
    roles = {o["metadata"]["name"]: o["rules"] for o in by_kind(objects, "ClusterRole")}
    assert set(roles) == {"rel-grpojob-ops", "rel-grpojob-ops-crds", "rel-grpojob-ops-kueue"}
    assert roles["rel-grpojob-ops-crds"] == [
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]}
    ]
    assert roles["rel-grpojob-ops-kueue"] == [KUEUE_READS]
    for binding in by_kind(objects, "ClusterRoleBinding"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rel-grpojob", "namespace": "ops"}]
        assert binding["roleRef"]["name"] == binding["metadata"]["name"]
    granted = {
        (g, r): set(rule["verbs"])
        for rule in roles["rel-grpojob-ops"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    # Nothing the operator never touches, and no verb that hands out rights.
    assert ("", "secrets") not in granted and ("", "nodes") not in granted and ("", "namespaces") not in granted
    assert all(not verbs & {"*", "escalate", "bind", "impersonate", "deletecollection"} for verbs in granted.values())
    assert all("*" not in key for key in granted)
    # The per-job trainer Role grants get/update/patch on a ConfigMap: the operator must hold them.
    assert {"get", "update", "patch"} <= granted[("", "configmaps")]
    # Every child kind the operator watches it may list and watch (a hub model's cache claim it also creates).
    from grpojob_operator import kinds

    for kind in kinds.WATCHED:
        assert {"list", "watch"} <= granted[(kind.group, kind.plural)], kind.kind
    assert "create" in granted[("", "persistentvolumeclaims")]


def _assert_only_the_leader_lease(objects: list[dict[str, Any]]) -> None:
    """Besides the operator's rules, one Role in the release namespace: the leader-election Lease."""
    (leader,) = [o for o in by_kind(objects, "Role") if o["metadata"]["name"].endswith("-leader")]
    assert leader["metadata"]["namespace"] == "ops"
    assert leader["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["grpojob-operator"],
            "verbs": ["get", "update", "patch"],
        },
    ]
    (binding,) = [o for o in by_kind(objects, "RoleBinding") if o["metadata"]["name"].endswith("-leader")]
    assert binding["roleRef"]["name"] == leader["metadata"]["name"]
    if not any(o["metadata"]["namespace"] != "ops" for o in by_kind(objects, "Role")):
        assert by_kind(objects, "Role") == [leader] and by_kind(objects, "RoleBinding") == [binding]


def test_namespaced_rbac_is_a_role_per_watched_namespace_and_a_flag_each(helm: Path):
    objects = render(helm, *VARIANTS["namespaced"])
    cluster_wide = render(helm)
    _assert_only_the_leader_lease(objects)
    objects = [o for o in objects if not o["metadata"]["name"].endswith("-leader")]
    roles = by_kind(objects, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    (main_rules,) = [
        o["rules"] for o in by_kind(cluster_wide, "ClusterRole") if o["metadata"]["name"] == "rel-grpojob-ops"
    ]
    assert all(r["rules"] == main_rules for r in roles)
    bindings = by_kind(objects, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert all(b["subjects"][0]["namespace"] == "ops" for b in bindings)
    # Cluster-scoped: only the read-only CRD and namespace watches, and the reads of Kueue's setup.
    cluster_rules = [rule for o in by_kind(objects, "ClusterRole") for rule in o["rules"]]
    assert cluster_rules == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
        KUEUE_READS,
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
    ]
    (deployment,) = by_kind(objects, "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["args"] == [
        "--namespace",
        "team-a",
        "--namespace",
        "team-b",
    ]
    strict = render(
        helm,
        *VARIANTS["namespaced"],
        "--set",
        "rbac.listNamespaces=false",
        "--set",
        "rbac.watchCustomResourceDefinitions=false",
        "--set",
        "kueue.enabled=false",
    )
    assert not [o for o in strict if o["kind"].startswith("Cluster")]


def test_the_service_monitor_is_off_by_default_and_scrapes_the_metrics_port(helm: Path):
    assert not by_kind(render(helm), "ServiceMonitor")
    (monitor,) = by_kind(render(helm, *VARIANTS["monitored"]), "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ops"]}


def test_the_trainer_pod_monitor_is_off_by_default_and_scrapes_the_metrics_port_of_trainer_pods(helm: Path):
    assert not by_kind(render(helm), "PodMonitor")
    (monitor,) = by_kind(render(helm, "--set", "metrics.trainerPodMonitor.enabled=true"), "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    trainer = build_trainer_job(parse_job(job_body()), OperatorSettings(), 1)["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= trainer["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in [p["name"] for p in trainer["spec"]["containers"][0]["ports"]]
    assert endpoint["path"] == "/metrics"
    (namespaced,) = by_kind(
        render(helm, "--set", "metrics.trainerPodMonitor.enabled=true", *VARIANTS["namespaced"]), "PodMonitor"
    )
    assert namespaced["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_every_value_is_documented():
    """Each key of values.yaml has a `# --` comment just above it, or is a map that only groups
    documented keys."""
    keys = []  # (indent, key, documented, has_children)
    lines = (CHART / "values.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"^( *)([A-Za-z][\w.-]*):( *)(.*)$", line)
        if match:
            documented = i > 0 and lines[i - 1].strip().startswith("# --")
            keys.append((len(match.group(1)), match.group(2), documented, match.group(4) == ""))

    def children(index: int) -> list[int]:
        indent, found = keys[index][0], []
        for j in range(index + 1, len(keys)):
            if keys[j][0] <= indent:
                break
            if not found or keys[j][0] == keys[found[0]][0]:
                found.append(j)
        return found

    def ok(index: int) -> bool:
        _, _, documented, has_children = keys[index]
        if documented:
            return True
        kids = children(index)
        return has_children and bool(kids) and all(ok(k) for k in kids)

    undocumented = [keys[i][1] for i in range(len(keys)) if keys[i][0] == 0 and not ok(i)]
    assert not undocumented, undocumented
    assert len([k for k in keys if k[0] == 0]) >= 15


def test_chart_app_version_matches_the_package_and_the_default_images():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    pyproject = (REPO / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE).group(1)
    assert chart["appVersion"] == version
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["defaults"]["rayImage"] == DEFAULT_RAY_IMAGE
    assert values["defaults"]["environmentImage"] == DEFAULT_ENVIRONMENT_IMAGE
