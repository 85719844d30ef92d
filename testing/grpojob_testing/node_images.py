"""The real test node's own two images, both holding one static program of ours (testing/probe/):

- ``PAUSE_IMAGE``, containerd's pod sandbox image (no registry can be reached, so ``registry.k8s.io/
  pause`` cannot be pulled); its process waits for a signal and reaps orphans;
- ``PROBE_IMAGE``, the test workload: exits with a code, serves HTTP, fetches a URL, resolves a name.

The program is built once into the cache (keyed by a hash of its source) and packed with `oci`.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from grpojob_testing import build, oci

PROBE_SOURCE = build.TESTING_DIR / "probe"
PAUSE_IMAGE = "grpojob.dev/test/pause:1"
PROBE_IMAGE = "grpojob.dev/test/probe:1"
PROBE_BINARY = "/usr/local/bin/grpojob-probe"


def probe_binary() -> Path:
    """Build the static grpojob-probe program unless cached; return its path."""
    digest = hashlib.sha256()
    for name in ("go.mod", "main.go"):
        digest.update((PROBE_SOURCE / name).read_bytes())
    target = build.cache_root() / "bin" / f"probe-{digest.hexdigest()[:12]}" / "grpojob-probe"
    if target.exists():
        return target
    partial = target.with_name("grpojob-probe.partial")
    partial.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(partial), "."],
        cwd=PROBE_SOURCE,
        env=build.go_env(),
        check=True,
    )
    shutil.move(partial, target)
    return target


def write_archives(directory: Path) -> dict[str, Path]:
    """Write the pause and probe image archives into ``directory``; return them by image name."""
    program = oci.ImageFile(PROBE_BINARY, probe_binary().read_bytes(), 0o755)
    archives = {PAUSE_IMAGE: directory / "pause.oci.tar", PROBE_IMAGE: directory / "probe.oci.tar"}
    oci.write_archive(archives[PAUSE_IMAGE], PAUSE_IMAGE, [program], [PROBE_BINARY])
    oci.write_archive(archives[PROBE_IMAGE], PROBE_IMAGE, [program], [PROBE_BINARY])
    return archives


def main(argv: list[str] | None = None) -> int:
    """``python -m grpojob_testing.node_images DIR``: write both archives (for `kind load image-archive`)."""
    parser = argparse.ArgumentParser(prog="python -m grpojob_testing.node_images", description=main.__doc__)
    parser.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    for name, archive in write_archives(args.directory).items():
        print(f"{name}: {archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
