"""The GPU node's image made from a machine's own files (`grpojob_testing.host_image`): a valid OCI archive of
three images sharing their layers, written in one stream, with what is left out left out."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpojob_testing import host_image, oci


@pytest.fixture
def small_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tree standing in for the machine: a library, a driver library, a package to leave out."""
    root = tmp_path / "machine"
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/libc.so.6").write_bytes(b"libc" * 1000)
    (root / "usr/lib/libcuda.so.580").write_bytes(b"driver")
    (root / "usr/lib/libcuda.so.1").symlink_to("libcuda.so.580")
    (root / "usr/lib/libc.so").symlink_to("libc.so.6")
    (root / "venv/site-packages/jax").mkdir(parents=True)
    (root / "venv/site-packages/jax/__init__.py").write_text("")
    (root / "venv/site-packages/torch").mkdir(parents=True)
    (root / "venv/site-packages/torch/__init__.py").write_text("x = 1\n")
    layers = [
        host_image.Layer("system", [(str(root / "usr"), "/usr")], (), host_image.DRIVER_FILES),
        host_image.Layer("python", [(str(root / "venv"), "/opt/venv")], (f"{root}/venv/site-packages/jax",)),
        host_image.Layer("grpojob", [], files=[oci.ImageFile("/etc/passwd", b"ray:x:1000:100::/tmp:/bin/sh\n")]),
    ]
    monkeypatch.setattr(host_image, "layers", lambda site_packages: layers)
    return root


def test_the_archive_holds_three_images_on_shared_layers_whose_blobs_match_their_digests(
    small_machine: Path, tmp_path: Path
):
    archive = tmp_path / "image.tar"
    with archive.open("wb") as out:
        digests = host_image.write_archive(out, tmp_path / "site-packages")
    assert set(digests) == {host_image.TRAINER, host_image.OPERATOR, host_image.ENVIRONMENTS}
    with tarfile.open(archive) as tar:
        blobs = {
            m.name.removeprefix("blobs/sha256/"): tar.extractfile(m).read() for m in tar if m.name.startswith("blobs/")
        }
        index = json.loads(tar.extractfile("index.json").read())
    for digest, blob in blobs.items():
        assert hashlib.sha256(blob).hexdigest() == digest
    names = {m["annotations"]["io.containerd.image.name"]: m["digest"] for m in index["manifests"]}
    assert names == digests
    manifests = [json.loads(blobs[d.removeprefix("sha256:")]) for d in digests.values()]
    assert len({json.dumps(m["layers"]) for m in manifests}) == 1, "the images share their layers"
    layers = manifests[0]["layers"]
    assert [len(blobs[layer["digest"].removeprefix("sha256:")]) for layer in layers] == [x["size"] for x in layers]
    operator_manifest = manifests[list(digests).index(host_image.OPERATOR)]
    operator = json.loads(blobs[operator_manifest["config"]["digest"].removeprefix("sha256:")])
    assert operator["config"]["Entrypoint"] == ["grpojob-operator"]
    assert operator["rootfs"]["diff_ids"] == [layer["digest"] for layer in layers]


def test_the_driver_and_the_excluded_packages_stay_out(small_machine: Path):
    system, python, _ = host_image.layers(Path("/nonexistent"))
    entries = {name: host for host, name in host_image.walk(system)}
    assert "usr/lib/libc.so.6" in entries and "usr/lib/libc.so" in entries
    assert not any("libcuda" in name for name in entries), "the device plugin mounts the host's driver"
    python_entries = {name for _, name in host_image.walk(python)}
    assert "opt/venv/site-packages/torch/__init__.py" in python_entries
    assert not any("jax" in name for name in python_entries)
    assert {"opt", "opt/venv"} <= python_entries, "parents come first"


def test_the_two_passes_write_the_same_bytes(small_machine: Path):
    system = host_image.layers(Path("/nonexistent"))[0]
    first, second = host_image._Digest(), host_image._Digest()
    host_image.write_layer(system, first)
    host_image.write_layer(system, second)
    assert first.hash.hexdigest() == second.hash.hexdigest()


@pytest.fixture
def containerd(tmp_path: Path) -> Iterator[str]:
    """A containerd of its own (the node's Debian package), without its CRI plugin; yields its socket."""
    if os.geteuid() != 0:
        pytest.skip("containerd needs root")
    if shutil.which("containerd") is None:
        pytest.skip("containerd is missing: make node-packages")
    root = Path(tempfile.mkdtemp(prefix="ctrd-", dir="/tmp"))  # a socket path has at most 107 bytes
    socket = root / "containerd.sock"
    config = root / "config.toml"
    config.write_text(
        f'version = 2\nroot = "{root}/root"\nstate = "{root}/state"\n'
        f'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n[grpc]\n  address = "{socket}"\n'
    )
    with (tmp_path / "containerd.log").open("wb") as log:
        process = subprocess.Popen(["containerd", f"--config={config}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        ctr = ["ctr", f"--address={socket}"]
        while subprocess.run([*ctr, "version"], capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, (tmp_path / "containerd.log").read_text()[-2000:]
            time.sleep(0.2)
        yield str(socket)
    finally:
        process.terminate()
        process.wait(30)
        subprocess.run(["sh", "-c", f"grep -o ' {root}[^ ]*' /proc/mounts | xargs -r -n1 umount -l"], check=False)
        shutil.rmtree(root, ignore_errors=True)


def test_the_stream_imports_into_containerd_and_a_container_runs_from_it(
    small_machine: Path, tmp_path: Path, containerd: str
):
    from grpojob_testing import node_images

    probe = oci.ImageFile("/usr/local/bin/grpojob-probe", node_images.probe_binary().read_bytes(), 0o755)
    host_image.layers(tmp_path)[2].files.append(probe)
    digests = host_image.import_into_containerd(containerd, tmp_path / "site-packages")
    ctr = ["ctr", f"--address={containerd}", "--namespace=k8s.io"]
    listed = subprocess.run([*ctr, "images", "ls", "-q"], capture_output=True, text=True, check=True).stdout.split()
    assert set(digests) <= set(listed)
    run = subprocess.run(
        [*ctr, "run", "--rm", host_image.TRAINER, "host-image-test", probe.path, "devices", "/usr/lib/libc.so.6"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "/usr/lib/libc.so.6 char-device=false" in run.stdout, run.stdout + run.stderr
    assert f"PYTHONPATH={host_image.GRPOJOB_ROOT}/site-packages" in run.stdout


def test_the_base_layers_go_ahead_and_the_images_import_then_sends_only_ours(
    small_machine: Path, tmp_path: Path, containerd: str
):
    """While the wheels travel, the machine's own layers are imported as the base image; the images' import
    then streams only the layer of the wheels and our code, and a container runs from the whole."""
    from grpojob_testing import node_images

    record = tmp_path / "base.json"
    (small_machine / "usr/lib/libbig.so").write_bytes(os.urandom(2 << 20))  # a layer blob that is dropped
    probe = oci.ImageFile("/usr/local/bin/grpojob-probe", node_images.probe_binary().read_bytes(), 0o755)
    host_image.layers(tmp_path)[2].files.append(probe)
    base = host_image.import_base(containerd, record=record, described=tmp_path / "described.json")
    assert host_image.imported_base(containerd, record=record) == base
    assert host_image.imported_base("/elsewhere.sock", record=record) is None, "another containerd lacks it"
    ctr = ["ctr", f"--address={containerd}", "--namespace=k8s.io"]
    content = subprocess.run([*ctr, "content", "ls", "-q"], capture_output=True, text=True, check=True).stdout
    assert base[0]["digest"] not in content, "the system layer's blob is dropped once unpacked"

    sent = tmp_path / "sent.tar"
    with sent.open("wb") as out:
        host_image.write_archive(out, tmp_path / "site-packages", base=base)
    with tarfile.open(sent) as tar:
        blobs = {m.name.removeprefix("blobs/sha256/") for m in tar if m.name.startswith("blobs/")}
    assert not {layer["digest"].removeprefix("sha256:") for layer in base} & blobs, "the base layers are not sent"

    digests = host_image.import_into_containerd(containerd, tmp_path / "site-packages", record=record)
    run = subprocess.run(
        [*ctr, "run", "--rm", host_image.TRAINER, "host-image-base", probe.path, "devices", "/usr/lib/libc.so.6"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert host_image.TRAINER in digests
    assert "/usr/lib/libc.so.6 char-device=false" in run.stdout, run.stdout + run.stderr


def test_the_python_layer_described_ahead_spares_the_import_its_first_pass(
    small_machine: Path, tmp_path: Path, containerd: str, capfd: pytest.CaptureFixture[str]
):
    """Described before the node is set up, the python layer is then only sent (the system layer, where the
    node's packages go, is described at import); the descriptors are used once, and are the ones a pass at
    import time would find."""
    described = tmp_path / "described.json"
    python = host_image.base_layers()[1]
    assert host_image.describe_base(described) == {"python": host_image.describe(python)}
    capfd.readouterr()

    imported = host_image.import_base(containerd, record=tmp_path / "base.json", described=described)
    log = capfd.readouterr().err
    assert imported == [host_image.describe(layer) for layer in host_image.base_layers()]
    assert "layer system:" in log and "layer python:" not in log, "the import reads the python layer once"
    assert not described.exists(), "descriptors are used once"


def test_a_base_layer_changed_after_it_was_described_is_described_again(
    small_machine: Path, tmp_path: Path, containerd: str, capfd: pytest.CaptureFixture[str]
):
    described = tmp_path / "described.json"
    ahead = host_image.describe_base(described)
    (small_machine / "venv/site-packages/torch/__init__.py").write_text("x = 2\n")  # same size, other bytes

    imported = host_image.import_base(containerd, record=tmp_path / "base.json", described=described)
    assert imported[1]["digest"] != ahead["python"]["digest"]
    assert imported == [host_image.describe(layer) for layer in host_image.base_layers()]
    assert "describing them again" in capfd.readouterr().err
    ctr = ["ctr", f"--address={containerd}", "--namespace=k8s.io"]
    listed = subprocess.run([*ctr, "images", "ls", "-q"], capture_output=True, text=True, check=True).stdout.split()
    assert host_image.BASE in listed


def test_nothing_vllm_requires_is_left_out_of_the_image():
    """The packages left out of the machine's Python are none of vLLM's requirements (its engine imports
    torchvision as it starts): none of the distributions the GPU image's vLLM lock installs matches them."""
    lock = (host_image.REPO / "images/vllm-requirements.txt").read_text()
    required = {
        re.sub(r"[-_.]+", "_", match.group(1)).lower()
        for match in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9_.\-]*)==", lock, re.MULTILINE)
    }
    assert {"vllm", "torchvision", "opencv_python_headless"} <= required, "the lock names vLLM's requirements"
    left_out = {name for name in required for pattern in host_image.EXCLUDED_PACKAGES if fnmatch.fnmatch(name, pattern)}
    assert not left_out
