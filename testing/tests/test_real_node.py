"""The real test node's pieces that need no root: its image archives and its config files."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tomllib
from pathlib import Path

from grpojob_testing import node, oci, pki


def test_an_oci_archive_is_reproducible_and_names_its_image(tmp_path: Path):
    files = [oci.ImageFile("/usr/local/bin/tool", b"#!/bin/true\n", 0o755)]
    first = oci.write_archive(tmp_path / "a.tar", "example.dev/tool:1", files, ["/usr/local/bin/tool"])
    second = oci.write_archive(tmp_path / "b.tar", "example.dev/tool:1", files, ["/usr/local/bin/tool"])
    assert first == second
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()

    with tarfile.open(tmp_path / "a.tar") as archive:
        index = json.load(archive.extractfile("index.json"))
        manifest_descriptor = index["manifests"][0]
        assert manifest_descriptor["annotations"]["io.containerd.image.name"] == "example.dev/tool:1"
        blob = archive.extractfile("blobs/sha256/" + manifest_descriptor["digest"].removeprefix("sha256:")).read()
        assert "sha256:" + hashlib.sha256(blob).hexdigest() == first
        manifest = json.loads(blob)
        config = json.load(archive.extractfile("blobs/sha256/" + manifest["config"]["digest"].removeprefix("sha256:")))
        assert config["config"]["Entrypoint"] == ["/usr/local/bin/tool"]
        assert config["rootfs"]["diff_ids"] == [manifest["layers"][0]["digest"]]


def test_a_layer_holds_the_files_with_their_modes_and_parent_directories():
    layer = oci.layer_tar([oci.ImageFile("/usr/local/bin/tool", b"x", 0o755)])
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert sorted(members) == ["usr", "usr/local", "usr/local/bin", "usr/local/bin/tool"]
    assert members["usr/local/bin/tool"].mode == 0o755 and members["usr"].isdir()
    assert {m.mtime for m in members.values()} == {0}


def test_containerd_keeps_everything_under_the_node_directory_and_uses_our_pause_image(tmp_path: Path):
    paths = node.NodePaths(tmp_path / "node")
    config = tomllib.loads(node.containerd_config(paths))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "grpojob.dev/test/pause:1"
    assert cri["restrict_oom_score_adj"] is True
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    for path in (config["root"], config["state"], config["grpc"]["address"], cri["cni"]["conf_dir"]):
        assert Path(path).is_relative_to(paths.root)


def test_the_kubelet_uses_cgroupfs_on_cgroup_v1_and_the_cluster_dns_service(tmp_path: Path):
    ports = {"kubelet": 1, "kubelet-healthz": 2}
    config = node.kubelet_config(node.NodePaths(tmp_path), tmp_path / "ca.crt", ports)
    assert (config["cgroupDriver"], config["failCgroupV1"]) == ("cgroupfs", False)
    assert config["clusterDNS"] == [node.DNS_SERVICE_IP]
    assert config["authentication"]["anonymous"]["enabled"] is False
    service, endpoints = node.dns_objects()
    assert service["spec"]["clusterIP"] == node.DNS_SERVICE_IP and "selector" not in service["spec"]
    assert endpoints["endpoints"][0]["addresses"] == [node.NODE_IP]


def test_the_pod_network_is_a_bridge_with_host_local_addresses_under_the_state_dir(tmp_path: Path):
    paths = node.NodePaths(tmp_path)
    bridge, portmap = node.cni_conflist(paths)["plugins"]
    assert bridge["bridge"] == node.BRIDGE and bridge["hairpinMode"] is True
    assert bridge["ipam"]["ranges"] == [[{"subnet": node.POD_SUBNET, "gateway": "10.245.0.1"}]]
    assert Path(bridge["ipam"]["dataDir"]).is_relative_to(tmp_path)
    assert portmap["type"] == "portmap"


def test_node_client_certificates_are_signed_by_the_cluster_ca(tmp_path: Path):
    from cryptography import x509

    p = pki.generate(tmp_path, "10.96.0.1", ["kubernetes"], extra_ips=(node.NODE_IP,))
    cert_path, key_path = pki.client_cert(p, "kubelet", "system:node:grpojob-node", "system:nodes")
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    ca = x509.load_pem_x509_certificate(p.ca_cert.read_bytes())
    assert cert.issuer == ca.subject and key_path.exists()
    assert "system:nodes" in cert.subject.rfc4514_string()
    serving = x509.load_pem_x509_certificate(p.serving_cert.read_bytes())
    ips = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.IPAddress
    )
    assert node.NODE_IP in {str(ip) for ip in ips}


def test_debian_packages_are_pinned_to_exact_versions():
    packages = node.debian_packages()
    assert set(packages) == {"containerd", "runc", "containernetworking-plugins", "iptables", "iproute2"}
    assert all(version[0].isdigit() for version in packages.values())
