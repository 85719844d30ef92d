"""Disk space for the builds and clusters of CI: what the caches hold, and what this tree no longer uses.

    python -m grpojob_testing.disk report   # free space, our caches and podman's storage, largest first
    python -m grpojob_testing.disk prune    # remove what this tree does not use, empty Go's build cache
    python -m grpojob_testing.disk room-for-gpu-image   # free what a GPU image build needs (`make gpu-image`)

CI's machine keeps ``~/.cache/grpojob`` and podman's storage between runs, and earlier trees' archives
(several GB each: the CPU trainer image is 6.5 GB) add up until a kind node, which unpacks every image
again, runs out of space. `prune` keeps exactly what this tree's builds use, and empties Go's build
cache once the pinned programs are built; `.ci/run` calls it before and after the image builds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from grpojob_testing import base_image, build, images, kind

GIB = 1 << 30
SCRATCH_PREFIXES = ("grpojob-base-", "grpojob-kind-node-", "grpojob-kind-debian-")
"""The temporary directories of the base and kind node builds, which an interrupted build leaves."""
OUR_REPOSITORIES = ("ghcr.io/grpojob/", "grpojob.dev/")
"""Where the images we build are named: podman images elsewhere are never touched."""


def free_bytes(path: Path = Path("/")) -> int:
    """Bytes free for an unprivileged write on the filesystem of ``path``."""
    return shutil.disk_usage(path).free


def size_of(path: Path) -> int:
    """Bytes a file or directory tree takes (``du``'s apparent size; symlinks not followed)."""
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def archives_in_use() -> set[Path]:
    """Every file of ``~/.cache/grpojob/images`` that this tree's builds read: each image's archive at
    its current inputs, the base's root filesystem, the kind node image, its Debian root filesystem
    and the KubeRay archive."""
    base_digest = base_image.inputs_hash()
    base_tar = base_image.rootfs_tar(base_digest)
    kept = {images.archive_path(image, images.inputs_hash(image, base_digest)) for image in images.images()}
    kept |= {base_tar, base_tar.with_name(base_tar.name + ".packages")}
    return kept | {kind.debian_rootfs_path(), kind.kuberay_archive_path(), kind.node_archive(kind.inputs_hash())}


def unused_archives(directory: Path, in_use: set[Path]) -> list[Path]:
    """The image archives (``*.tar``), partial writes and leftover build scratch directories in
    ``directory`` that are not ``in_use``; logs, locks and other directories stay."""
    unused = []
    for path in sorted(directory.iterdir()) if directory.is_dir() else []:
        archive = path.is_file() and path.name.endswith((".tar", ".partial", ".tar.packages"))
        scratch = path.is_dir() and path.name.startswith(SCRATCH_PREFIXES)
        if (archive or scratch) and path not in in_use:
            unused.append(path)
    return unused


def podman_images() -> list[dict]:
    """podman's images: each with ``Id``, ``Names`` (may be empty) and ``Size``."""
    listed = subprocess.run(["podman", "images", "--format", "json"], capture_output=True, text=True, check=False)
    return json.loads(listed.stdout or "[]") if listed.returncode == 0 else []


def unused_podman_images(listing: list[dict], wanted: set[str]) -> list[str]:
    """The ids of images named only in our repositories (`OUR_REPOSITORIES`) by names this tree does not
    build (``wanted``): an older tag of ours, or a GPU image this tree does not name."""
    unused = []
    for image in listing:
        names = image.get("Names") or []
        ours = names and all(name.startswith(OUR_REPOSITORIES) for name in names)
        if ours and not set(names) & wanted:
            unused.append(image["Id"])
    return unused


def wanted_podman_images() -> set[str]:
    """The podman image names this tree builds or runs: our images (the GPU trainer's too), the base,
    the kind node image."""
    return {*(image.name for image in [*images.images(), images.gpu_image()]), base_image.NAME, kind.NODE_IMAGE}


GPU_BUILD_BYTES = 32 * GIB
"""Free space a GPU image build may need when its pip layer is not cached: the ~9 GB the build container
writes, the layer committed from it, and the diff between them (builds failed with 27 GB and 21 GB free)."""


def reloadable_podman_images(listing: list[dict], archived: set[str]) -> list[str]:
    """The names of the podman images in ``listing`` whose every name has an archive from this tree
    (``archived``): removing them loses nothing, as the next build or test that needs one loads it
    back from its archive (`images.build_image`, `kind.build_node_image`)."""
    names = []
    for image in listing:
        held = image.get("Names") or []
        if held and set(held) <= archived:
            names += held
    return names


def archived_image_names() -> set[str]:
    """The podman image names that have an archive built from this tree in the cache: our CPU images and
    the kind node image (not the base, whose root filesystem every build starts from)."""
    names = {image.name for image in images.images() if images.tree_archive(image) is not None}
    return names | ({kind.NODE_IMAGE} if kind.node_archive(kind.inputs_hash()).exists() else set())


def room_for_gpu_image(log=sys.stdout) -> None:
    """Free `GPU_BUILD_BYTES` for a GPU image build unless podman holds this tree's image already:
    first the earlier tree's GPU image (the build's layer cache, worth keeping when there is room), then
    podman's copies of images whose archives are cached (`reloadable_podman_images`). CI's e2e phase
    leaves those copies; a GPU build with 21 GB free ran out of space."""
    if images.gpu_image_built() or not shutil.which("podman"):
        return
    with images.build_lock():
        for names in ([images.gpu_image().name], reloadable_podman_images(podman_images(), archived_image_names())):
            free = images.podman_free_bytes()
            if free >= GPU_BUILD_BYTES or not names:
                break
            print(f"{free / GIB:.1f} GiB free for a GPU image build: removing {' '.join(names)}", file=log, flush=True)
            subprocess.run(["podman", "rmi", "--force", *names], stdout=subprocess.DEVNULL, check=False)
        subprocess.run(["podman", "image", "prune", "--force"], stdout=subprocess.DEVNULL, check=False)
    free = images.podman_free_bytes()
    if free < GPU_BUILD_BYTES:
        needed = GPU_BUILD_BYTES / GIB
        print(f"warning: {free / GIB:.1f} GiB free; a GPU image build may need {needed:.0f} GiB", file=log)
        report(log)


def prune(log=sys.stdout) -> int:
    """Remove the archives and podman images this tree does not use, stopped containers, unused
    volumes, dangling layers and the working containers of interrupted buildah builds (each holds the
    layer it was writing: a killed GPU image build left 20 GB and filled the disk of the next one); return
    the bytes freed."""
    before = free_bytes()
    directory = build.cache_root() / "images"
    with images.build_lock():  # a build in progress owns its scratch directory and partial archive
        for path in unused_archives(directory, archives_in_use()):
            print(f"removing {path} ({size_of(path) / GIB:.1f} GiB)", file=log, flush=True)
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        if shutil.which("podman"):
            stale = unused_podman_images(podman_images(), wanted_podman_images())
            if stale:
                print(f"removing podman images {' '.join(i[:12] for i in stale)}", file=log, flush=True)
                subprocess.run(["podman", "rmi", "--force", *stale], stdout=subprocess.DEVNULL, check=False)
            if shutil.which("buildah"):  # no build of ours runs while we hold the lock
                subprocess.run(["buildah", "rm", "--all"], stdout=subprocess.DEVNULL, check=False)
            for what in (["container", "prune"], ["volume", "prune"], ["image", "prune"]):
                subprocess.run(["podman", *what, "--force"], stdout=subprocess.DEVNULL, check=False)
    trim_go_build_cache(log)
    freed = max(free_bytes() - before, 0)
    print(f"freed {freed / GIB:.1f} GiB; {free_bytes() / GIB:.1f} GiB free", file=log, flush=True)
    return freed


def trim_go_build_cache(log=sys.stdout) -> None:
    """Empty Go's build cache (8 GB after a cold build of the cluster programs) once every pinned
    program is built: the programs themselves are cached by version (`build.build`), and only a
    version change rebuilds one, from its module sources, which stay."""
    components = build.load_components().values()
    if shutil.which("go") is None or not all(component.bin_dir.is_dir() for component in components):
        return
    cache = Path(build.go_env()["GOCACHE"])
    if cache.is_dir():
        print(f"emptying Go's build cache {cache} ({size_of(cache) / GIB:.1f} GiB)", file=log, flush=True)
        subprocess.run(["go", "clean", "-cache"], env=build.go_env(), check=False)


def report(log=sys.stdout) -> None:
    """Print the free space and what our caches and podman's storage hold, largest first."""
    print(f"{free_bytes() / GIB:.1f} GiB free on /", file=log)
    places = [p for p in sorted(build.cache_root().glob("*")) if p.is_dir()]
    places += [Path("/var/lib/containers/storage"), Path.home() / ".cache" / "pip"]
    sizes = sorted(((size_of(p), p) for p in places if p.exists()), reverse=True)
    for size, path in sizes:
        print(f"{size / GIB:7.1f} GiB  {path}", file=log)


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(prog="python -m grpojob_testing.disk", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("report", "prune", "room-for-gpu-image"))
    args = parser.parse_args(argv)
    if args.command == "prune":
        prune()
    elif args.command == "room-for-gpu-image":
        room_for_gpu_image()
    else:
        report()  # walking podman's storage takes half a minute: only when asked for
    return 0


if __name__ == "__main__":
    sys.exit(main())
