"""The Helm chart on the real control plane: lint, a server-side dry run of its output, install,
upgrade and uninstall, and the operator run under exactly the rights the chart grants it."""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config

from tests.integration.operator.conftest import (
    Jobs,
    OperatorProcess,
    eventually,
    job_manifest,
)

from .conftest import CHART, Helm, Release, can_i, service_account_kubeconfig

pytestmark = pytest.mark.integration

CRD_NAME = "grpojobs.grpo.dev"
# How a refused request shows in the operator's log (its own ApiError, Kopf's errors and warnings).
REFUSED = re.compile(r"HTTP 403|status=403|'code': 403|[Ff]orbidden|Not enough permissions")


def test_helm_lint_is_clean(helm: Helm):
    helm("lint", "--strict", str(CHART))
    helm("lint", "--strict", str(CHART), "--set", "operator.watchNamespaces={a,b}")
    helm("lint", "--strict", str(CHART), "--set", "metrics.serviceMonitor.enabled=true")


@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
def test_rendered_chart_is_accepted_by_the_apiserver_in_a_server_side_dry_run(
    helm: Helm, kubectl_bin: Path, kubeconfig: Path, namespace: str, mode: str
):
    flags = ["--set", f"operator.watchNamespaces={{{namespace}}}"] if mode == "namespaced" else []
    rendered = helm("template", "dry", str(CHART), "--namespace", namespace, "--include-crds", *flags)
    kinds = sorted({doc["kind"] for doc in yaml.safe_load_all(rendered) if doc})
    expected_rbac = ["Role", "RoleBinding"] if mode == "namespaced" else []
    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount", "Service", *expected_rbac} <= set(kinds)
    result = subprocess.run(
        [str(kubectl_bin), f"--kubeconfig={kubeconfig}", "apply", "--dry-run=server", "-n", namespace, "-f", "-"],
        input=rendered,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "(server dry run)" in result.stdout
    assert "deployment.apps/dry-grpojob" in result.stdout


def test_install_upgrade_and_uninstall(release: Release, api_client, namespace: str):
    extensions = client.ApiextensionsV1Api(api_client)
    apps = client.AppsV1Api(api_client)
    core = client.CoreV1Api(api_client)
    rbac = client.RbacAuthorizationV1Api(api_client)
    try:
        extensions.read_custom_resource_definition(CRD_NAME)
        crd_was_there = True
    except client.ApiException as error:
        assert error.status == 404
        crd_was_there = False

    release.install("--wait", "--timeout", "120s")

    # The CRD from crds/ (created by this install on a fresh cluster; Helm never updates an existing one).
    crd = extensions.read_custom_resource_definition(CRD_NAME)
    assert any(c.type == "Established" and c.status == "True" for c in crd.status.conditions)
    committed = yaml.safe_load((CHART / "crds" / "grpo.dev_grpojobs.yaml").read_text())
    assert [v.name for v in crd.spec.versions] == [v["name"] for v in committed["spec"]["versions"]]
    if not crd_was_there:
        assert crd.metadata.creation_timestamp is not None

    # The operator's ServiceAccount, its RBAC and its Deployment (run by a kwok node).
    core.read_namespaced_service_account(release.fullname, namespace)
    role = rbac.read_cluster_role(release.cluster_name)
    assert any("grpojobs" in (rule.resources or []) for rule in role.rules)
    binding = rbac.read_cluster_role_binding(release.cluster_name)
    assert [(s.kind, s.name, s.namespace) for s in binding.subjects] == [
        ("ServiceAccount", release.fullname, namespace)
    ]
    rbac.read_cluster_role(f"{release.cluster_name}-crds")
    deployment = apps.read_namespaced_deployment(release.fullname, namespace)
    # Two replicas by default, one Lease between them (only its holder reconciles), spread over nodes.
    assert deployment.spec.replicas == 2 and deployment.spec.strategy.type == "RollingUpdate"
    assert deployment.status.available_replicas == 2
    assert deployment.spec.template.spec.affinity.pod_anti_affinity is not None
    leader_role = rbac.read_namespaced_role(f"{release.fullname}-leader", namespace)
    assert {tuple(rule.resources) for rule in leader_role.rules} == {("leases",)}
    container = deployment.spec.template.spec.containers[0]
    assert container.liveness_probe.http_get.path == "/healthz"
    env = {e.name: e.value for e in container.env}
    assert env["GRPOJOB_LOG_LEVEL"] == "INFO"
    assert env["GRPOJOB_LEADER_ELECTION_NAMESPACE"] == namespace
    core.read_namespaced_service(f"{release.fullname}-metrics", namespace)

    # Upgrade: a changed value reaches the Deployment.
    generation = deployment.metadata.generation
    release.upgrade("--reuse-values", "--set", "operator.logLevel=DEBUG", "--wait", "--timeout", "120s")
    deployment = apps.read_namespaced_deployment(release.fullname, namespace)
    assert deployment.metadata.generation > generation
    env = {e.name: e.value for e in deployment.spec.template.spec.containers[0].env}
    assert env["GRPOJOB_LOG_LEVEL"] == "DEBUG"
    assert deployment.metadata.labels["app.kubernetes.io/managed-by"] == "Helm"
    assert deployment.metadata.annotations["meta.helm.sh/release-name"] == release.name

    # Uninstall: the operator and its rights go; the CRD stays (Helm never deletes crds/ objects,
    # which would delete every GRPOJob with it).
    release.uninstall()

    def gone(read, *args) -> bool:
        try:
            read(*args)
        except client.ApiException as error:
            return error.status == 404
        return False

    assert gone(apps.read_namespaced_deployment, release.fullname, namespace)
    assert gone(core.read_namespaced_service_account, release.fullname, namespace)
    assert gone(rbac.read_cluster_role, release.cluster_name)
    assert gone(rbac.read_cluster_role_binding, release.cluster_name)
    assert gone(rbac.read_cluster_role, f"{release.cluster_name}-crds")
    extensions.read_custom_resource_definition(CRD_NAME)


def _operator_as_chart_service_account(
    release: Release, api_client, kubeconfig: Path, tmp_path: Path
) -> tuple[Path, client.ApiClient]:
    path = service_account_kubeconfig(
        api_client, kubeconfig, release.namespace, release.fullname, tmp_path / "operator.kubeconfig"
    )
    return path, config.new_client_from_config(str(path))


def _run_a_job_to_success_and_deletion(
    sa_kubeconfig: Path, api_client, namespace: str, tmp_path: Path, *, deleted_by: str
) -> None:
    """Run the operator with the given credentials through a GRPOJob's whole life, ended by the
    operator itself (``deleted_by="ttl"``: ttlSecondsAfterFinished) or by the user (``"user"``), and
    check that it was never refused anything."""
    operator = OperatorProcess(sa_kubeconfig, namespace, tmp_path / "operator.log").start()
    jobs = Jobs(api_client, namespace)
    spec = {"cleanupPolicy": "DeleteAll", "ttlSecondsAfterFinished": 1} if deleted_by == "ttl" else {}
    try:
        jobs.create(job_manifest("rbac", **spec))
        jobs.wait_phase("rbac", "Running")
        # The trainer's rights, created by the operator (which must hold get/update/patch on configmaps).
        rbac = client.RbacAuthorizationV1Api(api_client)
        role = rbac.read_namespaced_role("rbac-trainer", namespace)
        assert role.rules[0].resource_names == ["rbac-config"]
        assert rbac.read_namespaced_role_binding("rbac-trainer", namespace).role_ref.name == "rbac-trainer"
        (pod,) = jobs.trainer_pods("rbac")
        jobs.exit_pod(pod.metadata.name, 0)
        jobs.wait_phase("rbac", "Succeeded")
        reasons = [reason for reason, _ in jobs.events("rbac")]
        assert "PhaseSucceeded" in reasons, reasons

        def deleting() -> bool:
            try:
                return jobs.get("rbac")["metadata"].get("deletionTimestamp") is not None
            except client.ApiException as error:
                return error.status == 404

        def gone() -> bool:
            try:
                jobs.get("rbac")
            except client.ApiException as error:
                return error.status == 404
            return False

        if deleted_by == "ttl":
            eventually(deleting, "the operator to delete the GRPOJob (ttlSecondsAfterFinished)", 30)
        else:
            jobs.delete("rbac")
        # No finalizer holds it (the operator puts none): the garbage collector removes the children.
        eventually(gone, "the deleted GRPOJob to go", 30)
        assert operator.alive()
    finally:
        operator.stop()
    log = operator.log()
    refused = [line for line in log.splitlines() if REFUSED.search(line)]
    assert not refused, "\n".join(refused)
    assert "Failed to post an event" not in log


@pytest.mark.usefixtures("grpojob_crd", "fake_gpu_nodes")  # its job runs on kwok's GPU nodes
def test_the_operator_under_the_charts_cluster_wide_rbac_takes_a_job_through_its_whole_life(
    release: Release,
    api_client,
    kubeconfig: Path,
    namespace: str,
    tmp_path: Path,
):
    release.install()
    sa_kubeconfig, _ = _operator_as_chart_service_account(release, api_client, kubeconfig, tmp_path)
    # Installed cluster-wide, the operator runs without --namespace and never lists namespaces. Here it
    # is confined to this test's namespace (so that it leaves other tests' GRPOJobs alone), and given
    # --namespace Kopf lists and watches namespaces: the test grants that read, and nothing else.
    rbac = client.RbacAuthorizationV1Api(api_client)
    name = f"{release.cluster_name}-test-ns"
    rbac.create_cluster_role(
        {
            "metadata": {"name": name},
            "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}],
        }
    )
    subject = {"kind": "ServiceAccount", "name": release.fullname, "namespace": namespace}
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [subject],
        }
    )
    try:
        _run_a_job_to_success_and_deletion(sa_kubeconfig, api_client, namespace, tmp_path, deleted_by="ttl")
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


NOT_NEEDED = [
    # verb, resource, group, subresource
    ("delete", "namespaces", "", ""),
    ("create", "namespaces", "", ""),
    ("list", "namespaces", "", ""),
    ("get", "secrets", "", ""),
    ("list", "secrets", "", ""),
    ("create", "secrets", "", ""),
    ("patch", "nodes", "", ""),
    ("create", "pods", "", ""),
    ("delete", "pods", "", ""),
    ("create", "pods", "", "exec"),
    ("update", "grpojobs", "grpo.dev", ""),
    ("create", "grpojobs", "grpo.dev", ""),
    ("update", "deployments", "apps", ""),
    ("patch", "rayclusters", "ray.io", ""),
    ("delete", "roles", "rbac.authorization.k8s.io", ""),
    ("escalate", "roles", "rbac.authorization.k8s.io", ""),
    ("bind", "roles", "rbac.authorization.k8s.io", ""),
    ("create", "clusterroles", "rbac.authorization.k8s.io", ""),
    ("create", "clusterrolebindings", "rbac.authorization.k8s.io", ""),
    ("impersonate", "serviceaccounts", "", ""),
    ("create", "serviceaccounts", "", "token"),
    ("create", "customresourcedefinitions", "apiextensions.k8s.io", ""),
    ("delete", "customresourcedefinitions", "apiextensions.k8s.io", ""),
    ("create", "rayjobs", "ray.io", ""),
    # A job's NetworkPolicy is created once and goes with the job (owner reference): never changed.
    ("update", "networkpolicies", "networking.k8s.io", ""),
    ("delete", "networkpolicies", "networking.k8s.io", ""),
    # Kueue: the operator owns its jobs' Workloads (never another's spec) and only reads Kueue's setup.
    ("update", "workloads", "kueue.x-k8s.io", ""),
    ("patch", "workloads", "kueue.x-k8s.io", ""),
    ("create", "clusterqueues", "kueue.x-k8s.io", ""),
    ("create", "localqueues", "kueue.x-k8s.io", ""),
    ("list", "resourceflavors", "kueue.x-k8s.io", ""),
    ("patch", "resourceflavors", "kueue.x-k8s.io", ""),
]


def test_the_charts_rbac_denies_what_the_operator_does_not_need(
    release: Release, api_client, kubeconfig: Path, namespace: str, tmp_path: Path
):
    release.install()
    _, sa = _operator_as_chart_service_account(release, api_client, kubeconfig, tmp_path)
    try:
        allowed = [
            ("list", "grpojobs", "grpo.dev", ""),
            ("patch", "grpojobs", "grpo.dev", "status"),
            ("create", "rolebindings", "rbac.authorization.k8s.io", ""),
            ("create", "networkpolicies", "networking.k8s.io", ""),
            ("list", "customresourcedefinitions", "apiextensions.k8s.io", ""),
            ("create", "workloads", "kueue.x-k8s.io", ""),
            ("patch", "workloads", "kueue.x-k8s.io", "status"),
            ("get", "resourceflavors", "kueue.x-k8s.io", ""),
            ("get", "workloadpriorityclasses", "kueue.x-k8s.io", ""),
        ]
        for verb, resource, group, sub in allowed:
            assert can_i(sa, verb, resource, namespace, group, sub), (verb, resource, sub)
        # Cluster-wide mode: the same rights in any namespace and across all of them.
        assert can_i(sa, "watch", "pods", "")
        assert can_i(sa, "create", "rayclusters", "default", "ray.io")
        for verb, resource, group, sub in NOT_NEEDED:
            for where in (namespace, ""):
                assert not can_i(sa, verb, resource, where, group, sub), (verb, resource, sub, where or "*")
    finally:
        sa.close()


@pytest.mark.usefixtures("grpojob_crd", "fake_gpu_nodes")  # its job runs on kwok's GPU nodes
def test_namespaced_mode_grants_rights_only_in_the_watched_namespaces(
    release: Release,
    api_client,
    kubeconfig: Path,
    namespace: str,
    tmp_path: Path,
):
    release.install("--set", f"operator.watchNamespaces={{{namespace}}}")
    rbac = client.RbacAuthorizationV1Api(api_client)
    rbac.read_namespaced_role(release.fullname, namespace)
    namespace_reader = rbac.read_cluster_role(f"{release.cluster_name}-ns")
    assert [(r.resources, r.verbs) for r in namespace_reader.rules] == [(["namespaces"], ["list", "watch"])]
    with pytest.raises(client.ApiException) as missing:
        rbac.read_cluster_role(release.cluster_name)
    assert missing.value.status == 404
    deployment = client.AppsV1Api(api_client).read_namespaced_deployment(release.fullname, namespace)
    assert deployment.spec.template.spec.containers[0].args == ["--namespace", namespace]

    sa_kubeconfig, sa = _operator_as_chart_service_account(release, api_client, kubeconfig, tmp_path)
    outside = f"outside-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api_client)
    core.create_namespace({"metadata": {"name": outside, "labels": {"grpojob.dev/test": "true"}}})
    try:
        assert can_i(sa, "list", "grpojobs", namespace, "grpo.dev")
        assert not can_i(sa, "list", "grpojobs", outside, "grpo.dev")
        assert not can_i(sa, "list", "grpojobs", "", "grpo.dev")
        assert not can_i(sa, "create", "rayclusters", outside, "ray.io")
        assert not can_i(sa, "list", "pods", "")
        assert not can_i(sa, "get", "secrets", namespace)
        assert not can_i(sa, "delete", "namespaces", outside)
        with pytest.raises(client.ApiException) as denied:
            client.CustomObjectsApi(sa).list_namespaced_custom_object("grpo.dev", "v1alpha1", outside, "grpojobs")
        assert denied.value.status == 403
    finally:
        sa.close()
        core.delete_namespace(outside)

    _run_a_job_to_success_and_deletion(sa_kubeconfig, api_client, namespace, tmp_path, deleted_by="user")
