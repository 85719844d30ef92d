"""Build our images here with buildah from our Dockerfiles, export them, load them into containerd.

    python -m grpojob_testing.images build [NAME ...]   # base, then operator, trainer-cpu, environments, nemo-gym
    python -m grpojob_testing.images build-gpu          # the GPU trainer image (vLLM), into podman only
    python -m grpojob_testing.images list               # name, image, archive, whether it is built
    python -m grpojob_testing.images load ADDRESS       # import every archive into a containerd

No registry can be reached: the base comes from `base_image` (debootstrap), the Python packages from
`wheelhouse`. Each image is built only when the hash of its inputs (base, Dockerfile, target, build
args, the files it is made of) has no archive in ``~/.cache/grpojob/images/`` yet; the archive is a
docker-archive that ``ctr images import`` and ``podman load`` both read, tagged with the name the
chart and the operator's settings use. Builds and containers run with Debian's runc (crun refuses
this machine's cgroup v1 layout), the host network and ulimits that runc may set here (`ulimits`).
The real test node loads the archives with `load_into_containerd`.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import re
import resource
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from grpojob_testing import base_image, build, wheelhouse

REPO = build.TESTING_DIR.parent
PROJECT_FILES = (
    "pyproject.toml",
    "images/extra_requirements.py",
    "images/vllm-requirements.txt",
    "api/grpojob_api",
    "operator/grpojob_operator",
    "trainer/grpojob_trainer",
)
"""What the root Dockerfile's images are made of (the wheel and the requirements taken from pyproject);
a change in these rebuilds them. The test tooling is not among them: no image holds it."""
NEMO_GYM_FILES = ("images/nemo-gym",)
"""What the NeMo Gym image is made of: its Dockerfile, lock and entrypoint, none of our sources."""
RUNTIME = "runc"


def ulimits() -> list[str]:
    """The ``--ulimit`` flags a container needs on this machine: podman's defaults exceed what runc may set
    here, so the open-file limit is the machine's hard limit and the process limit is at most pid_max."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], int(Path("/proc/sys/kernel/pid_max").read_text()))
    return [f"--ulimit=nofile={nofile}:{nofile}", f"--ulimit=nproc={nproc}:{nproc}"]


def run_flags() -> list[str]:
    """The ``podman run`` flags of every container here: Debian's runc, the ulimits, the host network."""
    return [f"--runtime={RUNTIME}", *ulimits(), "--network=host"]


def version() -> str:
    """The project's version: the tag of every image."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@dataclass(frozen=True)
class Image:
    """One image built from one of our Dockerfiles."""

    key: str
    """Short name on the command line."""
    name: str
    """Full name and tag, as the chart and the operator's settings refer to it."""
    dockerfile: str
    """Path of the Dockerfile, relative to the repository."""
    target: str | None
    """The Dockerfile's stage to build, or None for its last."""
    files: tuple[str, ...]
    """The paths (files or folders, relative to the repository) the image is made of."""
    build_args: dict[str, str] = field(default_factory=dict)


def images() -> list[Image]:
    """The images of this repository, with the names the chart (values.yaml) and the operator use."""
    tag = version()
    cpu = {"WITH_VLLM": "false"}
    return [
        Image("operator", f"ghcr.io/grpojob/operator:{tag}", "Dockerfile", "operator", PROJECT_FILES),
        Image("trainer-cpu", f"ghcr.io/grpojob/trainer:{tag}-cpu", "Dockerfile", "trainer", PROJECT_FILES, cpu),
        Image("environments", f"ghcr.io/grpojob/environments:{tag}", "Dockerfile", "environments", PROJECT_FILES),
        Image("nemo-gym", f"ghcr.io/grpojob/nemo-gym:{tag}", "images/nemo-gym/Dockerfile", None, NEMO_GYM_FILES),
    ]


def context_files(paths: tuple[str, ...]) -> list[str]:
    """The files under ``paths`` (tracked or not ignored), sorted."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", *paths],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted({path for path in listed.split("\0") if path and (REPO / path).is_file()})


def inputs_hash(image: Image, base_digest: str) -> str:
    """A hash of everything `image` is built from."""
    digest = hashlib.sha256()
    inputs = {"base": base_digest, "name": image.name, "target": image.target, "args": image.build_args}
    digest.update(json.dumps(inputs).encode())
    for path in [image.dockerfile, *context_files(image.files)]:
        digest.update(path.encode() + b"\0" + (REPO / path).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def archive_path(image: Image, digest: str) -> Path:
    """Where the archive of `image` built from inputs `digest` is cached."""
    return build.cache_root() / "images" / f"{image.key}-{version()}-{digest}.docker.tar"


ARCHIVES_KEPT = 2
"""Archives kept per image: this build's and the newest other (another worktree's tree, built by a
session working in parallel, stays loadable by its own end-to-end run)."""


def tree_archive(image: Image) -> Path | None:
    """The cached archive of `image` built from this tree's inputs, or None."""
    archive = archive_path(image, inputs_hash(image, base_image.inputs_hash()))
    return archive if archive.exists() else None


def _prune_archives(image: Image, keep: Path) -> None:
    others = sorted(
        (p for p in keep.parent.glob(archive_path(image, "*").name) if p != keep),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for stale in others[ARCHIVES_KEPT - 1 :]:
        stale.unlink(missing_ok=True)


def build_image(image: Image, base_digest: str) -> tuple[Path, bool]:
    """Build `image` and export its archive unless cached; return the archive and whether it was built."""
    digest = inputs_hash(image, base_digest)
    archive = archive_path(image, digest)
    if archive.exists():
        if base_image.image_inputs(image.name) != digest:
            subprocess.run(["podman", "load", "--quiet", "--input", str(archive)], check=True)
        return archive, False
    archive.parent.mkdir(parents=True, exist_ok=True)
    _buildah(image, digest, wheelhouse.build_volumes())
    partial = archive.with_name(archive.name + ".partial")
    partial.unlink(missing_ok=True)
    subprocess.run(
        ["podman", "save", "--quiet", "--format", "docker-archive", "--output", str(partial), image.name], check=True
    )
    partial.rename(archive)
    _prune_archives(image, archive)
    return archive, True


def _buildah(image: Image, digest: str, volumes: list[str]) -> None:
    """Build `image` into podman's storage, labelled with its inputs ``digest``; raise with the log's
    tail when the build fails."""
    args = [f"--build-arg={key}={value}" for key, value in image.build_args.items()]
    if image.target:
        args.append(f"--target={image.target}")
    # --force-rm: a failed build leaves no working containers (and their GBs) behind.
    engine = ["buildah", "bud", "--layers", "--force-rm", "--pull=never", f"--runtime={RUNTIME}", "--network=host"]
    engine += ulimits()
    label = f"--label={base_image.INPUTS_LABEL}={digest}"
    log = build.cache_root() / "images" / f"{image.key}.build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        built = subprocess.run(
            [*engine, *volumes, *args, label, "--tag", image.name, "--file", image.dockerfile, "."],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if built.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-40:])
        raise RuntimeError(f"building {image.name} failed (log: {log}):\n{tail}")


def gpu_image() -> Image:
    """The GPU trainer image (vLLM): the Dockerfile's default trainer variant, which no test cluster
    runs; built only when asked for (`build_gpu_image`)."""
    return Image("trainer-gpu", f"ghcr.io/grpojob/trainer:{version()}", "Dockerfile", "trainer", PROJECT_FILES)


def gpu_image_built() -> bool:
    """Whether podman's storage holds the GPU trainer image built from this tree."""
    image = gpu_image()
    return base_image.image_inputs(image.name) == inputs_hash(image, base_image.inputs_hash())


PODMAN_STORAGE = Path("/var/lib/containers/storage")
"""Where podman keeps images, build layers and containers (kind's node's ``/var`` volume too)."""


def podman_free_bytes() -> int:
    """Bytes free where podman writes (the root filesystem when podman has not made its storage yet)."""
    return shutil.disk_usage(PODMAN_STORAGE if PODMAN_STORAGE.exists() else Path("/")).free


def build_gpu_image() -> bool:
    """Build the GPU trainer image into podman's storage unless it holds it from the same inputs;
    return whether it was built. No archive is written: at 9 GB it would double its space on disk,
    and no test node loads it. An earlier tree's GPU image is the build's layer cache; `make gpu-image`
    first makes room for the build (`grpojob_testing.disk room-for-gpu-image`)."""
    image = gpu_image()
    with build_lock():
        wanted = inputs_hash(image, base_image.ensure())
        if base_image.image_inputs(image.name) == wanted:
            return False
        _buildah(image, wanted, wheelhouse.build_volumes(gpu=True))
        subprocess.run(["podman", "image", "prune", "--force"], stdout=subprocess.DEVNULL, check=False)
        return True


def build_all(keys: list[str] | None = None) -> dict[str, Path]:
    """Make the base, then build the images named by `keys` (all when None); return their archives."""
    missing = [tool for tool in ("buildah", "podman", "debootstrap", RUNTIME) if shutil.which(tool) is None]
    if missing:
        raise SystemExit(f"missing {', '.join(missing)}: run `make image-tools` (as root)")
    unknown = set(keys or []) - {image.key for image in images()}
    if unknown:
        raise SystemExit(f"unknown images: {', '.join(sorted(unknown))}")
    with build_lock():
        return _build_locked(keys)


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """Hold the machine's image-build lock: concurrent builds share layers that a finishing one prunes."""
    lock = build.cache_root() / "images" / ".lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another image build ({lock})", flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _build_locked(keys: list[str] | None) -> dict[str, Path]:
    started = time.monotonic()
    base_digest = base_image.ensure()
    print(f"base {base_image.NAME} ({base_digest}) ready after {time.monotonic() - started:.0f}s", flush=True)
    archives, any_built = {}, False
    for image in images():
        if keys and image.key not in keys:
            continue
        started = time.monotonic()
        archives[image.key], built = build_image(image, base_digest)
        print(f"{image.name}: {'built' if built else 'cached'} in {time.monotonic() - started:.0f}s", flush=True)
        any_built = any_built or built
    if any_built:
        # Untagged layers of earlier builds: any source change rebuilds every layer after the wheel's COPY.
        subprocess.run(["podman", "image", "prune", "--force"], stdout=subprocess.DEVNULL, check=False)
    return archives


def load_into_containerd(archive: Path, address: str | Path, namespace: str = "k8s.io") -> list[str]:
    """Import an image archive into the containerd at socket `address` (namespace ``k8s.io`` is the one
    the kubelet's CRI uses), unpacked for its default snapshotter, its layer blobs then dropped
    (`discard_layer_blobs`); return the names of the images."""
    ctr = ["ctr", "--address", str(address), "--namespace", namespace]
    result = subprocess.run([*ctr, "images", "import", str(archive)], capture_output=True, text=True, check=True)
    discard_layer_blobs(ctr)
    return re.findall(r"^unpacking (\S+) \(", result.stdout, re.MULTILINE)


def discard_layer_blobs(ctr: list[str]) -> None:
    """Remove the layer blobs (every blob of a megabyte or more; manifests and configs are smaller) from
    the content store of the containerd that the command ``ctr`` (with its address and namespace)
    reaches; their unpacked snapshots stay, and containers run from those. This is what containerd's
    ``discard_unpacked_layers`` does for pulls but not for ``ctr images import``: without it the CPU
    trainer image takes twice its 6.5 GB in a node."""
    listing = subprocess.run([*ctr, "content", "ls"], capture_output=True, text=True, check=True).stdout
    rows = [row.split() for row in listing.splitlines()[1:]]
    layers = [row[0] for row in rows if len(row) > 1 and re.fullmatch(r"[\d.]+[MG]i?B", row[1])]
    if layers:
        subprocess.run([*ctr, "content", "rm", *layers], capture_output=True, check=True)


def load_all_into_containerd(address: str | Path, namespace: str = "k8s.io") -> list[str]:
    """Import the archive of every image built from this tree into a containerd; return the names of the
    images."""
    names = []
    for image in images():
        archive = tree_archive(image)
        if archive is None:
            raise RuntimeError(f"{image.key} is not built from this tree: python -m grpojob_testing.images build")
        names += load_into_containerd(archive, address, namespace)
    return names


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(prog="python -m grpojob_testing.images", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_command = commands.add_parser("build", help="build the images unless cached")
    build_command.add_argument("keys", nargs="*", help="operator, trainer-cpu, environments, nemo-gym (default: all)")
    commands.add_parser("build-gpu", help="build the GPU trainer image (vLLM) into podman's storage unless cached")
    commands.add_parser("list", help="show the images and their cached archives")
    load = commands.add_parser("load", help="import every built archive into a containerd")
    load.add_argument("address", help="containerd's socket")
    load.add_argument("--namespace", default="k8s.io")
    args = parser.parse_args(argv)
    if args.command == "build":
        try:
            built = build_all(args.keys or None)
        except (RuntimeError, subprocess.CalledProcessError) as error:
            print(error, file=sys.stderr)
            return 1
        for key, archive in built.items():
            print(f"{key}: {archive} ({archive.stat().st_size / 2**20:.0f} MiB)")
    elif args.command == "build-gpu":
        started = time.monotonic()
        try:
            built = build_gpu_image()
        except (RuntimeError, subprocess.CalledProcessError) as error:
            print(error, file=sys.stderr)
            return 1
        print(f"{gpu_image().name}: {'built' if built else 'cached'} in {time.monotonic() - started:.0f}s")
    elif args.command == "list":
        for image in images():
            archive = tree_archive(image)
            print(f"{image.key:12} {image.name:40} {archive or '(not built from this tree)'}")
    else:
        try:
            print("\n".join(load_all_into_containerd(args.address, args.namespace)))
        except RuntimeError as error:
            print(error, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
