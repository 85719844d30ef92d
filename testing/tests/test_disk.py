"""CI's disk hygiene: what `grpojob_testing.disk prune` removes from a machine that keeps its caches,
and how much room a kind node must have before our images are loaded into it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from grpojob_testing import build, disk, kind, node_images

GIB = 1 << 30


def test_prune_removes_other_trees_archives_and_leftover_scratch_but_keeps_this_trees(tmp_path: Path):
    in_use = {tmp_path / "trainer-cpu-0.1.0-aaaa.docker.tar", tmp_path / "python-3.13-slim-trixie-bbbb.rootfs.tar"}
    unused = {
        tmp_path / "trainer-cpu-0.1.0-cccc.docker.tar",
        tmp_path / "kind-node-v1.34.4-dddd.docker.tar",
        tmp_path / "operator-0.1.0-eeee.docker.tar.partial",
        tmp_path / "python-3.13-slim-trixie-ffff.rootfs.tar.packages",
    }
    kept_besides = {tmp_path / "trainer-cpu.build.log", tmp_path / ".lock"}
    for path in in_use | unused | kept_besides:
        path.write_bytes(b"x")
    (tmp_path / "grpojob-kind-node-x1y2").mkdir()  # an interrupted node image build
    (tmp_path / "kind-node-images").mkdir()  # the probe and pause archives, rewritten each run

    found = disk.unused_archives(tmp_path, in_use)

    assert set(found) == unused | {tmp_path / "grpojob-kind-node-x1y2"}


def test_prune_takes_only_our_images_this_tree_does_not_name():
    listing = [
        {"Id": "trainer-now", "Names": ["ghcr.io/grpojob/trainer:0.1.0-cpu"]},
        {"Id": "trainer-old", "Names": ["ghcr.io/grpojob/trainer:0.0.9-cpu"]},
        {"Id": "old-node", "Names": ["grpojob.dev/kind/node:v1.33.0"]},
        {"Id": "someone-elses", "Names": ["docker.io/library/postgres:16"]},
        {"Id": "dangling", "Names": []},
    ]
    wanted = {"ghcr.io/grpojob/trainer:0.1.0-cpu", kind.NODE_IMAGE}

    assert disk.unused_podman_images(listing, wanted) == ["trainer-old", "old-node"]


def test_room_for_a_gpu_build_takes_only_podman_copies_that_an_archive_of_this_tree_can_restore():
    listing = [
        {"Id": "trainer", "Names": ["ghcr.io/grpojob/trainer:0.1.0-cpu"]},
        {"Id": "node", "Names": [kind.NODE_IMAGE]},
        {"Id": "gym-two-tags", "Names": ["ghcr.io/grpojob/nemo-gym:0.1.0", "localhost/mine:1"]},
        {"Id": "base", "Names": ["docker.io/library/python:3.13-slim-trixie"]},
        {"Id": "gpu", "Names": ["ghcr.io/grpojob/trainer:0.1.0"]},
        {"Id": "dangling", "Names": []},
    ]
    archived = {"ghcr.io/grpojob/trainer:0.1.0-cpu", kind.NODE_IMAGE, "ghcr.io/grpojob/nemo-gym:0.1.0"}

    assert disk.reloadable_podman_images(listing, archived) == ["ghcr.io/grpojob/trainer:0.1.0-cpu", kind.NODE_IMAGE]


def test_the_images_this_tree_uses_are_the_ones_ci_builds():
    wanted = disk.wanted_podman_images()

    assert {"ghcr.io/grpojob/trainer:0.1.0-cpu", "ghcr.io/grpojob/trainer:0.1.0"} <= wanted
    assert kind.NODE_IMAGE in wanted
    assert all(name.startswith((*disk.OUR_REPOSITORIES, "docker.io/library/python:")) for name in wanted)


def test_a_kind_node_must_hold_every_image_unpacked_plus_the_largest_ones_blobs():
    sizes = [6 * GIB, 1 * GIB, GIB // 4]

    needed = kind.space_needed_to_load(sizes)

    assert 13 * GIB < needed < 15 * GIB
    assert kind.space_needed_to_load([]) == 0


def test_gos_build_cache_is_emptied_only_once_every_pinned_program_is_built(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("GRPOJOB_CACHE", str(tmp_path))
    env = build.go_env()
    program = ["go", "build", "-o", str(tmp_path / "probe"), "."]
    subprocess.run(program, cwd=node_images.PROBE_SOURCE, env=env, check=True)
    cache = Path(env["GOCACHE"])
    filled = disk.size_of(cache)
    components = list(build.load_components().values())
    for component in components[1:]:
        component.bin_dir.mkdir(parents=True)

    disk.trim_go_build_cache()  # one program is missing: a rebuild would want the cache
    assert disk.size_of(cache) == filled > 0

    components[0].bin_dir.mkdir(parents=True)
    disk.trim_go_build_cache()
    assert disk.size_of(cache) < filled / 10
