"""The Ray pods' image on a GPU machine that reaches no registry and has no image builder, made from the
machine's own user space and imported into the real node's containerd (`make e2e-gpu`).

    python -m grpojob_testing.host_image plan                  # what goes in, and how big each tree is
    python -m grpojob_testing.host_image describe-base             # their digests, before containerd runs
    python -m grpojob_testing.host_image import-base CONTAINERD_SOCKET   # the machine's own layers, ahead
    python -m grpojob_testing.host_image import CONTAINERD_SOCKET
    python -m grpojob_testing.host_image write ARCHIVE         # the same OCI archive into a file

Three layers, written as a stream straight into ``ctr images import -`` (no archive on disk, so the disk
holds the image twice at most, in containerd's content store and its snapshot, until the layer blobs are
dropped):

1. ``system``: the machine's ``/usr``, ``/etc`` and the merged-``/usr`` links, less the CUDA toolkit
   (``/usr/local/cuda*``: PyTorch and vLLM bring their CUDA libraries as wheels), the driver (its
   libraries and ``nvidia-smi``: the device plugin mounts the host's into each GPU container, as the NVIDIA
   container toolkit does) and documentation;
2. ``python``: the interpreter's own prefix (``sys.base_prefix``, when it is not ``/usr``) and the
   environment that holds PyTorch (``sys.prefix``), less packages no part of a job imports (JAX, CuPy,
   ONNX, ...: ``EXCLUDED_PACKAGES``), at their own paths, so the environment works unchanged;
3. ``grpojob``: ``/opt/grpojob/site-packages`` (the vLLM and Ray wheels installed under
   ``/tmp/site-packages`` by benchmarks/device/h200.sh, and the operator's wheels from `gpu_node`; not at
   ``/tmp``, where every pod mounts an emptyDir), this repository's packages under ``/opt/grpojob/src``,
   the ``grpojob`` and ``grpojob-operator`` commands, and ``/etc/passwd`` and ``/etc/group`` with the
   trainer image's user (1000, ``ray``) and the operator's (65532).

The layers are shared by three image names, which differ only in their entrypoint as the Dockerfile's
targets do: ``TRAINER`` (the Ray pods and the trainer Job), ``OPERATOR`` and ``ENVIRONMENTS``.

How this differs from the Dockerfile's GPU ``trainer`` image (`make gpu-image`):

- Python 3.12 of the machine (the Dockerfile's: Debian trixie's 3.13), with the machine's torch 2.11.0
  (CUDA 13.0) and transformers 5.17.0 and the vLLM 0.26.0 / Ray 2.60.0 wheels of
  ../shared/gpu/gpu-wheels.txt rather than images/vllm-requirements.txt's lock: the same vLLM, Ray and
  torch, other versions of some of the rest (what ``ray[default]`` adds to Ray, which the Ray pods' probes
  need, comes with the node's parts at the lock's pins: `gpu_node.RAY_POD_WHEELS`); every image of a job is
  this one, so the Python and Ray of the Ray pods, the trainer and the environment servers agree, as they
  must;
- our code from the source tree on ``PYTHONPATH`` rather than an installed wheel (no ``grpojob``
  distribution metadata), and the commands as small scripts;
- the machine's whole user space (its compiler and Python headers too, which Triton and vLLM use at start)
  rather than a slim Debian base; nothing is installed with apt or pip in it;
- ``HF_HUB_OFFLINE=1``: the machine reaches no hub;
- the files keep the machine's owners (root) and are made readable by everyone; the image's user is
  still 1000 for the Ray pods (the operator's pod templates set it).

Reproducible for one machine: entries are sorted and the tar headers carry no user or group names, so the
two passes (one to learn each layer's digest and size, one to send it) write the same bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import io
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from grpojob_testing import build, oci

REPO = build.TESTING_DIR.parent
TAG = "0.1.0-gpu-node"
TRAINER = f"grpojob.dev/gpu-node/trainer:{TAG}"
OPERATOR = f"grpojob.dev/gpu-node/operator:{TAG}"
ENVIRONMENTS = f"grpojob.dev/gpu-node/environments:{TAG}"
BASE = f"grpojob.dev/gpu-node/base:{TAG}"
BASE_LAYERS = 2
"""The first two layers (system, python) are the machine's own, which the wheels do not change: `import_base`
sends them as the image ``BASE`` while the wheels are still arriving, and the images' import then sends only
ours."""
GRPOJOB_ROOT = "/opt/grpojob"
SOURCE_PACKAGES = {"api": "grpojob_api", "operator": "grpojob_operator", "trainer": "grpojob_trainer"}

SYSTEM_TREES = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
SYSTEM_EXCLUDED = (
    "/usr/local/cuda*",
    "/usr/local/nvidia",
    "/usr/share/doc",
    "/usr/share/man",
    "/usr/share/info",
    "/usr/src",
    "/opt/nvidia",
)
"""Kept: /etc/ld.so.cache, which finds the libraries of /etc/ld.so.conf.d's folders; its entries for the
driver's libraries name files the image lacks, and LD_LIBRARY_PATH (the device plugin's) comes first."""
DRIVER_FILES = (
    "libcuda.so*",
    "libcudadebugger.so*",
    "libnvidia-*.so*",
    "libnvcuvid.so*",
    "libnvoptix.so*",
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-*",
)
"""The driver's user-space files, by name: the device plugin gives each GPU container the host's."""
EXCLUDED_PACKAGES = (
    "jax",
    "jaxlib",
    "jax_cuda*",
    "jax_plugins",
    "cupy",
    "cupy_*",
    "cupyx",
    "onnx",
    "onnx_ir",
    "onnxruntime",
    "onnxscript",
    "tensorstore",
    "flax",
    "optax",
    "orbax*",
    "chex",
    "numpyro",
    "botorch",
    "gpytorch",
    "linear_operator",
    "e3nn",
    "diffrax",
    "equinox",
    "lineax",
    "optimistix",
    "sentence_transformers",
    "pytorch_lightning",
    "lightning",
    "lightning_*",
    "timm",
    "skimage",
    "scikit_image*",
    "statsmodels",
    "xarray",
    "torch_geometric*",
)
"""Top-level entries of site-packages (modules, their ``*.dist-info`` and ``*.libs``) that no part of a job
imports: the GPU machine's image is a general one. Nothing vLLM requires is among them: its engine imports
torchvision at start, and its lock (images/vllm-requirements.txt) holds torchaudio and OpenCV too."""
IMAGE_ENV = {
    "PYTHONUNBUFFERED": "1",
    "HOME": "/tmp/home",
    "XDG_CACHE_HOME": "/tmp/cache",
    "HF_HOME": "/tmp/cache/huggingface",
    "HF_HUB_OFFLINE": "1",
    "TRITON_CACHE_DIR": "/tmp/cache/triton",
    "VLLM_CACHE_ROOT": "/tmp/cache/vllm",
    "MPLCONFIGDIR": "/tmp/cache/matplotlib",
}
WGET_SHIM = """import sys, urllib.request
# KubeRay's probes run `wget -T 2 -q -O- URL`; the machine has no wget (the Dockerfile installs Debian's).
args = sys.argv[1:]
timeout = float(args[args.index("-T") + 1]) if "-T" in args else 10.0
try:
    with urllib.request.urlopen(args[-1], timeout=timeout) as response:
        sys.stdout.buffer.write(response.read())
except Exception as error:
    print(error, file=sys.stderr)
    sys.exit(1)
"""
PASSWD_LINES = ("ray:x:1000:100:ray:/tmp/home:/bin/bash", "grpojob:x:65532:65532:grpojob:/tmp:/usr/sbin/nologin")
GROUP_LINES = ("grpojob:x:65532:",)


@dataclass
class Layer:
    """One layer: host trees (host path, path in the image), excluded host paths (fnmatch), and files."""

    name: str
    trees: list[tuple[str, str]] = field(default_factory=list)
    excluded: tuple[str, ...] = ()
    excluded_names: tuple[str, ...] = ()
    files: list[oci.ImageFile] = field(default_factory=list)


def python_trees() -> list[tuple[str, str]]:
    """The interpreter's prefix (unless it is /usr) and the environment's, and where ``python3`` points."""
    trees = []
    for prefix in dict.fromkeys((os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix))):
        if prefix != "/usr" and not prefix.startswith("/usr/"):
            trees.append((prefix, prefix))
    executable = os.path.realpath(sys.executable)
    if not any(executable.startswith(tree + "/") for tree, _ in trees) and not executable.startswith("/usr/"):
        trees.append((executable, executable))
    return trees


def package_exclusions() -> tuple[str, ...]:
    """``EXCLUDED_PACKAGES`` as host paths in the environment's site-packages."""
    purelib = os.path.realpath(sysconfig.get_paths()["purelib"])
    names = []
    for package in EXCLUDED_PACKAGES:
        names += [package, f"{package}-*.dist-info", f"{package}.libs", f"{package}.py"]
    return tuple(f"{purelib}/{name}" for name in names)


def command_script(module: str, function: str = "main") -> bytes:
    """A console script of the image's interpreter."""
    python = os.path.realpath(sys.executable) if sys.prefix == sys.base_prefix else f"{sys.prefix}/bin/python3"
    return f"#!{python}\nimport sys\nfrom {module} import {function}\nsys.exit({function}())\n".encode()


def grpojob_files(site_packages: Path) -> tuple[list[tuple[str, str]], list[oci.ImageFile]]:
    """Layer 3's trees and files."""
    trees = [(str(site_packages), f"{GRPOJOB_ROOT}/site-packages")]
    trees += [
        (str(REPO / folder / package), f"{GRPOJOB_ROOT}/src/{folder}/{package}")
        for folder, package in SOURCE_PACKAGES.items()
    ]
    passwd = Path("/etc/passwd").read_text().rstrip("\n").splitlines()
    group = Path("/etc/group").read_text().rstrip("\n").splitlines()
    taken_users = {line.split(":")[2] for line in passwd if line.count(":") >= 2}
    taken_groups = {line.split(":")[2] for line in group if line.count(":") >= 2}
    passwd += [line for line in PASSWD_LINES if line.split(":")[2] not in taken_users]
    group += [line for line in GROUP_LINES if line.split(":")[2] not in taken_groups]
    python = command_script("x").split(b"\n", 1)[0]
    files = [
        oci.ImageFile(f"{GRPOJOB_ROOT}/bin/grpojob", command_script("grpojob_trainer.cli"), 0o755),
        # KubeRay starts Ray with `bash -lc`, and a login shell's /etc/profile may set PATH anew.
        oci.ImageFile("/etc/profile.d/grpojob.sh", f"export PATH={image_path()}\n".encode()),
        oci.ImageFile(f"{GRPOJOB_ROOT}/bin/grpojob-operator", command_script("grpojob_operator.__main__"), 0o755),
        oci.ImageFile("/etc/passwd", ("\n".join(passwd) + "\n").encode()),
        oci.ImageFile("/etc/group", ("\n".join(group) + "\n").encode()),
    ]
    if shutil.which("wget") is None:
        files.append(oci.ImageFile(f"{GRPOJOB_ROOT}/bin/wget", python + b"\n" + WGET_SHIM.encode(), 0o755))
    return trees, files


def layers(site_packages: Path) -> list[Layer]:
    trees, files = grpojob_files(site_packages)
    return [
        Layer(
            "system",
            [(tree, tree) for tree in SYSTEM_TREES if os.path.lexists(tree)],
            SYSTEM_EXCLUDED,
            DRIVER_FILES,
        ),
        Layer("python", python_trees(), (*package_exclusions(), "*/__pycache__/*.pyc.*"), DRIVER_FILES),
        # The wheels' bytecode is compiled beforehand (benchmarks/device/e2e-gpu.sh): the pods' root is read-only.
        Layer("grpojob", trees, (f"{REPO}/*/__pycache__",), files=files),
    ]


def image_path() -> str:
    """The image's PATH: the environment's commands, ours, the wheels' (ray, vllm), the system's."""
    path = [f"{sys.prefix}/bin", f"{GRPOJOB_ROOT}/bin", f"{GRPOJOB_ROOT}/site-packages/bin"]
    return ":".join([*path, "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"])


def image_config(layer_digests: list[str], entrypoint: list[str] | None, cmd: list[str] | None) -> dict:
    python_path = [f"{GRPOJOB_ROOT}/site-packages", *(f"{GRPOJOB_ROOT}/src/{folder}" for folder in SOURCE_PACKAGES)]
    env = {"PATH": image_path(), "PYTHONPATH": ":".join(python_path), **IMAGE_ENV}
    config: dict = {"Env": [f"{k}={v}" for k, v in env.items()], "WorkingDir": "/tmp"}
    if entrypoint:
        config["Entrypoint"] = entrypoint
    if cmd:
        config["Cmd"] = cmd
    return {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": layer_digests},
    }


IMAGES = {
    TRAINER: (None, ["grpojob", "--help"]),
    OPERATOR: (["grpojob-operator"], None),
    ENVIRONMENTS: (["python3", "-m", "grpojob_trainer.environments"], ["arithmetic"]),
}


# -- writing ---------------------------------------------------------------------------------------


def _excluded(path: str, patterns: tuple[str, ...], names: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(path, p) for p in patterns) or any(
        fnmatch.fnmatch(os.path.basename(path), n) for n in names
    )


def walk(layer: Layer) -> Iterator[tuple[str, str]]:
    """(host path, path in the image without the leading slash) of every entry of the layer's trees,
    parents first, sorted, each once."""
    emitted: set[str] = set()
    for host_root, image_root in layer.trees:
        parents = Path(image_root.lstrip("/")).parents
        for parent in reversed(parents):
            name = str(parent)
            if name != "." and name not in emitted:
                emitted.add(name)
                yield "", name
        stack = [(host_root, image_root.lstrip("/"))]
        while stack:
            host, name = stack.pop()
            if name in emitted or _excluded(host, layer.excluded, layer.excluded_names):
                continue
            emitted.add(name)
            yield host, name
            if os.path.isdir(host) and not os.path.islink(host):
                try:
                    children = sorted(os.listdir(host), reverse=True)
                except OSError:
                    continue
                stack += [(os.path.join(host, child), f"{name}/{child}") for child in children]


def write_layer(layer: Layer, out: BinaryIO) -> None:
    """Write the layer's tar to ``out`` (deterministically for an unchanged machine)."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, copybufsize=1 << 20) as tar:
        image_files = {f.path.lstrip("/") for f in layer.files}
        for host, name in walk(layer):
            if name in image_files:
                continue
            if not host:
                info = tarfile.TarInfo(name)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(_normalised(info))
                continue
            try:
                info = tar.gettarinfo(host, name)
            except OSError:
                continue
            if info is None:  # a socket
                continue
            info = _normalised(info)
            if info.isreg():
                with open(host, "rb") as file:
                    tar.addfile(info, file)
            else:
                tar.addfile(info)
        for image_file in sorted(layer.files, key=lambda f: f.path):
            info = tarfile.TarInfo(image_file.path.lstrip("/"))
            info.size, info.mode = len(image_file.content), image_file.mode
            tar.addfile(_normalised(info), io.BytesIO(image_file.content))


def _normalised(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uname = info.gname = ""
    if info.isdir():
        info.mode |= 0o555
    elif not info.issym():
        info.mode |= 0o444
    return info


class _Digest(io.RawIOBase):
    """A sink that only counts and hashes."""

    def __init__(self) -> None:
        self.hash, self.size = hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.hash.update(data)
        self.size += len(data)
        return len(data)


def _entry(out: BinaryIO, name: str, size: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = size, 0o644
    out.write(info.tobuf(format=tarfile.PAX_FORMAT))


def _pad(out: BinaryIO, size: int) -> None:
    out.write(b"\0" * (-size % tarfile.BLOCKSIZE))


def _blob(out: BinaryIO, blob: bytes) -> None:
    _entry(out, f"blobs/sha256/{hashlib.sha256(blob).hexdigest()}", len(blob))
    out.write(blob)
    _pad(out, len(blob))


def describe(layer: Layer) -> dict:
    """The layer's descriptor (digest and size): a pass over its files that writes nothing."""
    started = time.monotonic()
    digest = _Digest()
    write_layer(layer, digest)
    print(f"layer {layer.name}: {digest.size / 2**30:.2f} GiB ({time.monotonic() - started:.0f}s)", file=sys.stderr)
    return {"mediaType": oci.LAYER_MEDIA_TYPE, "digest": f"sha256:{digest.hash.hexdigest()}", "size": digest.size}


def describe_all(built: list[Layer]) -> list[dict]:
    """The layers' descriptors, each layer described in a process of its own (each pass reads and hashes
    gigabytes on one core, and the GPU machine has sixteen)."""
    if len(built) < 2:
        return [describe(layer) for layer in built]
    with ProcessPoolExecutor(max_workers=len(built), mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(describe, built))


def send_layer(out: BinaryIO, layer: Layer, descriptor: dict) -> None:
    """The layer's blob, under the name of its digest: a second pass over its files."""
    started = time.monotonic()
    _entry(out, f"blobs/sha256/{descriptor['digest'].removeprefix('sha256:')}", descriptor["size"])
    counter = _Counting(out)
    write_layer(layer, counter)
    if counter.size != descriptor["size"]:
        raise RuntimeError(f"layer {layer.name} changed between the passes: a file of it is being written")
    _pad(out, descriptor["size"])
    print(f"sent layer {layer.name} ({time.monotonic() - started:.0f}s)", file=sys.stderr)


def write_images(out: BinaryIO, images: dict[str, tuple], descriptors: list[dict]) -> dict[str, str]:
    """Each image's config and manifest over ``descriptors``, the index and the archive's end; return the
    manifest digests by name."""
    manifests, digests = [], {}
    for name, (entrypoint, cmd) in images.items():
        config = json.dumps(image_config([d["digest"] for d in descriptors], entrypoint, cmd), sort_keys=True).encode()
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": oci.MANIFEST_MEDIA_TYPE,
                "config": {
                    "mediaType": oci.CONFIG_MEDIA_TYPE,
                    "digest": f"sha256:{hashlib.sha256(config).hexdigest()}",
                    "size": len(config),
                },
                "layers": descriptors,
            },
            sort_keys=True,
        ).encode()
        _blob(out, config)
        _blob(out, manifest)
        digests[name] = f"sha256:{hashlib.sha256(manifest).hexdigest()}"
        manifests.append(
            {
                "mediaType": oci.MANIFEST_MEDIA_TYPE,
                "digest": digests[name],
                "size": len(manifest),
                "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": TAG},
                "platform": {"architecture": "amd64", "os": "linux"},
            }
        )
    index = json.dumps({"schemaVersion": 2, "mediaType": oci.INDEX_MEDIA_TYPE, "manifests": manifests}).encode()
    _entry(out, "index.json", len(index))
    out.write(index)
    _pad(out, len(index))
    out.write(b"\0" * (2 * tarfile.BLOCKSIZE))
    out.flush()
    return digests


def _start_archive(out: BinaryIO) -> None:
    _entry(out, "oci-layout", len(layout := json.dumps({"imageLayoutVersion": "1.0.0"}).encode()))
    out.write(layout)
    _pad(out, len(layout))


def write_archive(out: BinaryIO, site_packages: Path, base: list[dict] | None = None) -> dict[str, str]:
    """Stream the OCI archive of the three images to ``out``; return their manifest digests by name.

    ``base``: the descriptors of the machine's layers (system, python) that the containerd already holds
    (`write_base_archive`); their blobs are left out of the stream, and only ours is read and sent."""
    built = layers(site_packages)
    known = list(base or [])
    descriptors = known + [describe(layer) for layer in built[len(known) :]]
    _start_archive(out)
    for layer, descriptor in zip(built[len(known) :], descriptors[len(known) :], strict=True):
        send_layer(out, layer, descriptor)
    return write_images(out, IMAGES, descriptors)


def base_layers() -> list[Layer]:
    """The machine's own layers (system, python), which do not depend on the wheels."""
    return layers(Path("/nonexistent"))[:BASE_LAYERS]


def write_base_archive(out: BinaryIO, described: dict[str, dict] | None = None) -> list[dict]:
    """Stream the OCI archive of ``BASE``, the machine's own layers (system, python) that do not change as
    the wheels arrive; return their descriptors (``described``: some of them by layer name, from
    `describe_base`, so that only the sending pass reads those layers' files now)."""
    built = base_layers()
    ahead = described or {}
    fresh = iter(describe_all([layer for layer in built if layer.name not in ahead]))
    descriptors = [ahead[layer.name] if layer.name in ahead else next(fresh) for layer in built]
    _start_archive(out)
    for layer, descriptor in zip(built, descriptors, strict=True):
        send_layer(out, layer, descriptor)
    write_images(out, {BASE: (None, ["python3", "--version"])}, descriptors)
    return descriptors


class _Counting(io.RawIOBase):
    """Passes writes on to ``out``, counting them."""

    def __init__(self, out: BinaryIO) -> None:
        self.out, self.size = out, 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.out.write(data)
        self.size += len(data)
        return len(data)


def _import(address: str, namespace: str, write):
    """Stream what ``write(out)`` writes into ``ctr images import -``, then drop the layer blobs (their
    snapshots stay: containers run from those, and a later import of images on the same layers unpacks only
    the layers on top); return what ``write`` returned."""
    from grpojob_testing import images

    ctr = ["ctr", "--address", address, "--namespace", namespace]
    importer = subprocess.Popen([*ctr, "images", "import", "-"], stdin=subprocess.PIPE)
    try:
        result = write(importer.stdin)
    finally:
        # A stream cut short ends the importer (with an error) rather than leaving it waiting.
        with contextlib.suppress(BrokenPipeError):
            importer.stdin.close()
        importer.wait()
    if importer.returncode != 0:
        raise RuntimeError(f"ctr images import failed ({importer.returncode})")
    images.discard_layer_blobs(ctr)
    return result


def base_record() -> Path:
    """Where `import_base` writes the descriptors of the layers it sent, and for which containerd."""
    return build.cache_root() / "host-image-base.json"


def described_base_record() -> Path:
    """Where `describe_base` leaves the base layers' descriptors for the next `import_base`."""
    return build.cache_root() / "host-image-base-described.json"


AHEAD_LAYERS = ("python",)
"""The base layers `describe_base` describes: the GPU node's set-up installs its packages (dpkg) into the
system layer's trees, so that one is described when it is imported."""


def describe_base(described: Path | None = None) -> dict[str, dict]:
    """Describe the base layers in ``AHEAD_LAYERS`` ahead of their import, while nothing else needs the
    machine's disks and cores (on the GPU machine: before the node is set up), and leave their descriptors,
    by layer name, for `import_base`."""
    path = described or described_base_record()
    built = [layer for layer in base_layers() if layer.name in AHEAD_LAYERS]
    descriptors = {layer.name: descriptor for layer, descriptor in zip(built, describe_all(built), strict=True)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".partial").write_text(json.dumps(descriptors))
    path.with_suffix(".partial").replace(path)
    return descriptors


def import_base(
    address: str, namespace: str = "k8s.io", record: Path | None = None, described: Path | None = None
) -> list[dict]:
    """Import ``BASE`` (the machine's own layers) into the containerd at ``address``, with the descriptors
    `describe_base` left where there are some (used once); record its layers' descriptors for
    `import_into_containerd`."""
    started = time.monotonic()
    path = described or described_base_record()
    ahead = json.loads(path.read_text()) if path.exists() else None
    path.unlink(missing_ok=True)
    try:
        descriptors = _import(address, namespace, lambda out: write_base_archive(out, described=ahead))
    except (RuntimeError, OSError):
        if ahead is None:
            raise
        # Most likely a file of the layers changed after they were described, and containerd refused the stream.
        print("the import with the layers described ahead failed: describing them again", file=sys.stderr)
        descriptors = _import(address, namespace, write_base_archive)
    (record or base_record()).write_text(json.dumps({"address": address, "layers": descriptors}))
    print(f"imported {BASE} in {time.monotonic() - started:.0f}s", file=sys.stderr)
    return descriptors


def imported_base(address: str, namespace: str = "k8s.io", record: Path | None = None) -> list[dict] | None:
    """The base layers' descriptors, where `import_base` imported ``BASE`` into this containerd and it still
    holds it."""
    path = record or base_record()
    if not path.exists():
        return None
    recorded = json.loads(path.read_text())
    listed = subprocess.run(
        ["ctr", "--address", address, "--namespace", namespace, "images", "ls", "-q"], capture_output=True, text=True
    ).stdout.split()
    return recorded["layers"] if recorded.get("address") == address and BASE in listed else None


def import_into_containerd(
    address: str, site_packages: Path, namespace: str = "k8s.io", record: Path | None = None
) -> dict[str, str]:
    """Stream the archive into ``ctr images import -`` of the containerd at ``address`` (leaving out the base
    layers where `import_base` has imported them there); return the manifest digests by image name."""
    started = time.monotonic()
    base = imported_base(address, namespace, record)
    digests = _import(address, namespace, lambda out: write_archive(out, site_packages, base=base))
    left_out = " (the base layers were there already)" if base else ""
    print(f"imported {', '.join(digests)} in {time.monotonic() - started:.0f}s{left_out}", file=sys.stderr)
    return digests


def plan(site_packages: Path) -> list[tuple[str, str, str]]:
    """(layer, host tree, size as du reports it) of every tree, and what is left out."""
    rows = []
    for layer in layers(site_packages):
        for host, _ in layer.trees:
            size = subprocess.run(["du", "-sh", host], capture_output=True, text=True).stdout.split("\t")[0]
            rows.append((layer.name, host, size))
        for pattern in layer.excluded:
            for match in sorted(
                {str(p) for p in Path("/").glob(pattern.lstrip("/"))} if pattern.startswith("/") else []
            ):
                size = subprocess.run(["du", "-sh", match], capture_output=True, text=True).stdout.split("\t")[0]
                rows.append((layer.name, f"(left out) {match}", size))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpojob_testing.host_image", description=__doc__.split("\n")[0])
    parser.add_argument("--site-packages", type=Path, default=Path("/tmp/site-packages"))
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("plan", help="the trees of each layer and their sizes")
    import_command = commands.add_parser("import", help="stream the images into a containerd")
    import_command.add_argument("address", help="containerd's socket")
    commands.add_parser("describe-base", help="describe the machine's own layers ahead of their import")
    base_command = commands.add_parser("import-base", help="stream the machine's own layers into a containerd")
    base_command.add_argument("address", help="containerd's socket")
    write_command = commands.add_parser("write", help="write the OCI archive into a file")
    write_command.add_argument("archive", type=Path)
    args = parser.parse_args(argv)
    if args.command == "plan":
        for layer, tree, size in plan(args.site_packages):
            print(f"{layer:8} {size:>6}  {tree}")
    elif args.command == "describe-base":
        for name, descriptor in describe_base().items():
            print(name, descriptor["digest"], descriptor["size"])
    elif args.command == "import-base":
        for descriptor in import_base(args.address):
            print(descriptor["digest"], descriptor["size"])
    elif args.command == "import":
        for name, digest in import_into_containerd(args.address, args.site_packages).items():
            print(f"{name} {digest}")
    else:
        with args.archive.open("wb") as out:
            for name, digest in write_archive(out, args.site_packages).items():
                print(f"{name} {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
