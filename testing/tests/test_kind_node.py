"""The kind node image's pieces that need no root and no container: the images it preloads are those
kubeadm asks for with our cluster config, and its configuration points at them."""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
import tomllib
from pathlib import Path

import yaml

from grpojob_testing import build, kind, node_images, oci


def cluster_config() -> dict:
    return yaml.safe_load((kind.KIND_DIR / "cluster.yaml").read_text())


def test_kubeadm_with_our_cluster_config_asks_for_exactly_the_images_the_node_holds(tmp_path: Path):
    patches = [yaml.safe_load(patch) for patch in cluster_config()["kubeadmConfigPatches"]]
    cluster_configuration = next(p for p in patches if p["kind"] == "ClusterConfiguration")
    config = {
        **cluster_configuration,
        "apiVersion": "kubeadm.k8s.io/v1beta3",
        "kubernetesVersion": kind.KUBERNETES_VERSION,
    }
    (tmp_path / "kubeadm.yaml").write_text(yaml.safe_dump(config))
    kubeadm = build.build(build.load_components()["kubernetes"]) / "kubeadm"
    listed = subprocess.run(
        [str(kubeadm), "config", "images", "list", f"--config={tmp_path / 'kubeadm.yaml'}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    # containerd's sandbox image is ours (below); kubeadm only names its own.
    wanted = {image for image in listed if "/pause:" not in image}
    provisioner = f"{kind.REPOSITORY}/local-path-provisioner:"
    assert wanted == {image for image in kind.cluster_images() if not image.startswith(provisioner)}


def test_the_cluster_config_uses_our_node_image_and_no_default_cni():
    config = cluster_config()
    assert [n["image"] for n in config["nodes"]] == [kind.NODE_IMAGE]
    assert config["networking"]["disableDefaultCNI"] is True


def test_containerd_runs_our_pause_image_with_the_systemd_cgroup_driver_and_debian_cni_plugins():
    config = tomllib.loads((kind.NODE_FILES / "etc/containerd/config.toml").read_text())
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == node_images.PAUSE_IMAGE
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    assert cri["cni"]["bin_dir"] == "/usr/lib/cni"  # containernetworking-plugins installs there


def test_the_static_pod_network_lies_in_the_pod_subnet_kind_gives_kubeadm():
    conflist = json.loads((kind.NODE_FILES / "etc/cni/net.d/10-ptp.conflist").read_text())
    ranges = conflist["plugins"][0]["ipam"]["ranges"]
    assert ranges == [[{"subnet": "10.244.0.0/24"}]]  # the first /24 of kind's default 10.244.0.0/16


def test_the_storage_provisioner_runs_images_the_node_holds():
    documents = list(yaml.safe_load_all((kind.NODE_FILES / "kind/manifests/default-storage.yaml").read_text()))
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] in kind.cluster_images()
    assert f"--helper-image={kind.DEBIAN_IMAGE}" in container["command"]
    helper = yaml.safe_load(next(d for d in documents if d["kind"] == "ConfigMap")["data"]["helperPod.yaml"])
    assert helper["spec"]["containers"][0]["image"] == kind.DEBIAN_IMAGE


def test_an_oci_archive_stacks_base_layers_under_its_files(tmp_path: Path):
    base = tmp_path / "base.tar"
    with tarfile.open(base, "w") as tar:
        info = tarfile.TarInfo("bin/sh")
        tar.addfile(info)
    files = [oci.ImageFile("/usr/local/bin/tool", b"x", 0o755)]
    oci.write_archive(tmp_path / "image.tar", "example.dev/tool:1", files, ["/usr/local/bin/tool"], (base,))
    with tarfile.open(tmp_path / "image.tar") as archive:
        index = json.load(archive.extractfile("index.json"))
        manifest_digest = index["manifests"][0]["digest"].removeprefix("sha256:")
        manifest = json.load(archive.extractfile(f"blobs/sha256/{manifest_digest}"))
        first = manifest["layers"][0]["digest"]
        assert first == "sha256:" + hashlib.sha256(base.read_bytes()).hexdigest()
        assert archive.extractfile(f"blobs/sha256/{first.removeprefix('sha256:')}").read() == base.read_bytes()
        assert len(manifest["layers"]) == 2
