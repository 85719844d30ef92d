"""Write an OCI image archive (an OCI image layout in a tar) from files, without any tool: one layer
of the given files, on top of base layers given as tar files.

The real test node cannot pull images, so its own small images (the pod sandbox image and the test
workload) are written here and imported with ``ctr images import``. Archives are reproducible: every
timestamp is zero and entries are sorted, so the same files give the same image digest.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"


@dataclass(frozen=True)
class ImageFile:
    """One regular file of the image's only layer."""

    path: str
    content: bytes
    mode: int = 0o644


def _tar_entry(tar: tarfile.TarFile, name: str, content: bytes | None, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.mode = 0, 0, 0, mode
    if content is None:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    else:
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))


def layer_tar(files: list[ImageFile]) -> bytes:
    """An uncompressed layer holding ``files`` and their parent directories."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        directories = sorted({str(p) for f in files for p in Path(f.path.lstrip("/")).parents if str(p) != "."})
        for directory in directories:
            _tar_entry(tar, directory + "/", None, 0o755)
        for file in sorted(files, key=lambda f: f.path):
            _tar_entry(tar, file.path.lstrip("/"), file.content, file.mode)
    return buffer.getvalue()


def _descriptor(media_type: str, blob: bytes) -> dict:
    return {"mediaType": media_type, "digest": "sha256:" + hashlib.sha256(blob).hexdigest(), "size": len(blob)}


def _json(value: dict) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _file_descriptor(media_type: str, path: Path) -> dict:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return {"mediaType": media_type, "digest": "sha256:" + digest.hexdigest(), "size": path.stat().st_size}


def write_archive(
    path: Path, reference: str, files: list[ImageFile], entrypoint: list[str], base_layers: tuple[Path, ...] = ()
) -> str:
    """Write an OCI archive of a linux/amd64 image named ``reference`` to ``path``: the uncompressed
    layer tars ``base_layers``, then one layer of ``files``. Return its manifest digest. ``ctr images
    import`` names the image from the index's annotations."""
    layer = layer_tar(files)
    base_descriptors = [_file_descriptor(LAYER_MEDIA_TYPE, base) for base in base_layers]
    layer_descriptors = [*base_descriptors, _descriptor(LAYER_MEDIA_TYPE, layer)]
    config = _json(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Entrypoint": entrypoint,
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            },
            "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in layer_descriptors]},
        }
    )
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": _descriptor(CONFIG_MEDIA_TYPE, config),
            "layers": layer_descriptors,
        }
    )
    manifest_descriptor = _descriptor(MANIFEST_MEDIA_TYPE, manifest)
    manifest_descriptor["annotations"] = {
        "io.containerd.image.name": reference,
        "org.opencontainers.image.ref.name": reference.rsplit(":", 1)[-1],
    }
    manifest_descriptor["platform"] = {"architecture": "amd64", "os": "linux"}
    index = _json({"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": [manifest_descriptor]})
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        _tar_entry(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}), 0o644)
        _tar_entry(tar, "index.json", index, 0o644)
        _tar_entry(tar, "blobs/", None, 0o755)
        _tar_entry(tar, "blobs/sha256/", None, 0o755)
        for blob in sorted((layer, config, manifest), key=lambda b: hashlib.sha256(b).hexdigest()):
            _tar_entry(tar, "blobs/sha256/" + hashlib.sha256(blob).hexdigest(), blob, 0o644)
        for base, descriptor in zip(base_layers, base_descriptors, strict=True):
            info = tarfile.TarInfo("blobs/sha256/" + descriptor["digest"].removeprefix("sha256:"))
            info.mtime, info.uid, info.gid, info.mode, info.size = 0, 0, 0, 0o644, descriptor["size"]
            with base.open("rb") as file:
                tar.addfile(info, file)
    return manifest_descriptor["digest"]
