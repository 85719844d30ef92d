"""The Python base image of our Dockerfiles, made here from Debian packages (no registry can be pulled).

``debootstrap`` writes a minimal Debian 13 "trixie" root filesystem with Python 3.13, pip, venv and
CA certificates; the trixie-updates and trixie-security updates are applied; it is trimmed (no apt
lists, docs, man pages, locales), given the ``python`` and ``pip`` commands the official ``python``
images have (pip may install outside a venv, as there), packed into a tar cached under
``~/.cache/grpojob/images/`` by a hash of these inputs (not of the day's package versions: delete the
tar to take newer updates), and imported into the container storage under the exact name the
Dockerfiles' ``FROM ${PYTHON_IMAGE}`` uses.

Every image of a job's Ray cluster (Ray head and workers, trainer, environments) runs this one Python:
Ray refuses nodes and drivers of another Python minor version, and NeMo Gym needs Python >= 3.12
(Debian has 3.11 in bookworm and 3.13 in trixie). So the Dockerfiles' default base is
``python:3.13-slim-trixie``: the same Python minor version and Debian release as the official image
of that name, which a real registry serves. It is not bit-for-bit that image (Debian's
``python3.13`` in ``/usr/bin`` instead of a source build in ``/usr/local``); the Debian package
versions it holds are written next to the tar (``<tar>.packages``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from grpojob_testing import build

PYTHON = "3.13"
"""The Python minor version of the base (trixie's), of every image and of the wheelhouse's wheels."""
SUITE = "trixie"
TAG = f"{PYTHON}-slim-{SUITE}"
NAME = f"docker.io/library/python:{TAG}"
"""The fully qualified name of ``python:3.13-slim-trixie``, the Dockerfiles' ``PYTHON_IMAGE``."""
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv", "python3-pip", "ca-certificates")
SOURCES = (
    f"deb {MIRROR} {SUITE} main\n"
    f"deb {MIRROR} {SUITE}-updates main\n"
    f"deb http://deb.debian.org/debian-security {SUITE}-security main\n"
)
"""The base's apt sources: debootstrap installs from the release, then the updates and security
suites are applied, as in Debian's own images."""
INPUTS_LABEL = "dev.grpojob.inputs"
"""Image label holding the hash of the inputs an image was built from."""

# Paths removed from the root filesystem (relative, shell globs), as the official slim images do.
TRIM = (
    "var/lib/apt/lists/*",
    "var/cache/apt/*.bin",
    "var/cache/apt/archives/*.deb",
    "var/log/*",
    "usr/share/doc/*",
    "usr/share/man/*",
    "usr/share/info/*",
    "usr/share/locale/*",
    # Debian marks its Python "externally managed"; the official images let pip install anywhere.
    f"usr/lib/python{PYTHON}/EXTERNALLY-MANAGED",
)
LINKS = {"usr/bin/python": "python3", "usr/bin/pip": "pip3"}
CHANGES = ("ENV=LANG=C.UTF-8", 'CMD=["python3"]')


def debootstrap_version() -> str:
    """The installed debootstrap's version (part of the base's inputs)."""
    result = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "debootstrap"], capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


def inputs_hash() -> str:
    """A hash of everything the base is made from: suite, mirror, packages, trimming, debootstrap."""
    inputs = {
        "suite": SUITE,
        "mirror": MIRROR,
        "packages": PACKAGES,
        "sources": SOURCES,
        "trim": TRIM,
        "links": LINKS,
        "changes": CHANGES,
        "debootstrap": debootstrap_version(),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def rootfs_tar(digest: str) -> Path:
    """Where the packed root filesystem of inputs ``digest`` is cached."""
    return build.cache_root() / "images" / f"python-{TAG}-{digest}.rootfs.tar"


def make_rootfs_tar(target: Path) -> None:
    """Debootstrap, trim and pack the root filesystem into ``target`` (written atomically)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="grpojob-base-", dir=target.parent) as scratch:
        rootfs = Path(scratch) / "rootfs"
        subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(rootfs), MIRROR],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        upgrade(rootfs)
        for pattern in TRIM:
            for path in rootfs.glob(pattern):
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        for link, points_to in LINKS.items():
            (rootfs / link).unlink(missing_ok=True)
            (rootfs / link).symlink_to(points_to)
        packages = subprocess.run(
            ["chroot", str(rootfs), "dpkg-query", "-W", "-f", "${Package}=${Version}\n"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        target.with_name(target.name + ".packages").write_text(packages)
        partial = target.with_name(target.name + ".partial")
        excludes = [f"--exclude=./{d}/*" for d in ("dev", "proc", "sys", "run", "tmp")]
        subprocess.run(["tar", "-C", str(rootfs), *excludes, "--sort=name", "-cf", str(partial), "."], check=True)
        partial.rename(target)


def upgrade(rootfs: Path) -> None:
    """Apply the point-release and security updates of ``SOURCES`` to the debootstrapped ``rootfs``."""
    (rootfs / "etc" / "apt" / "sources.list").write_text(SOURCES)
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    for command in (["update", "-qq"], ["upgrade", "-qq", "--yes", "--no-install-recommends"], ["clean"]):
        done = subprocess.run(["chroot", str(rootfs), "apt-get", *command], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"apt-get {command[0]} in the base failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def image_inputs(name: str) -> str | None:
    """The inputs label of image ``name`` in the container storage, or None when it is absent."""
    result = subprocess.run(
        ["podman", "image", "inspect", "--format", f'{{{{index .Labels "{INPUTS_LABEL}"}}}}', name],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() if result.returncode == 0 else None


def ensure() -> str:
    """Make the base image unless the storage holds it from the same inputs; return its inputs hash."""
    digest = inputs_hash()
    if image_inputs(NAME) == digest:
        return digest
    tar = rootfs_tar(digest)
    if not tar.exists():
        for stale in tar.parent.glob(rootfs_tar("*").name + "*"):
            stale.unlink()
        make_rootfs_tar(tar)
    changes = [*CHANGES, f"LABEL={INPUTS_LABEL}={digest}"]
    subprocess.run(
        ["podman", "import", "--quiet", *(f"--change={c}" for c in changes), str(tar), NAME],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return digest
