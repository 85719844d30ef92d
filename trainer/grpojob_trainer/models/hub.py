"""Hugging Face model ids: the one download of a job's model into a hub cache, and filling a cache offline.

`download_model` is what the download step of a job (`grpojob download-model`) runs: `huggingface_hub`'s
own `snapshot_download` into the cache volume, which resolves the revision to one commit; every pod of
the job then loads that commit's snapshot directory (`grpojob_api.paths.hub_snapshot_path`) with
``HF_HUB_OFFLINE=1``. With ``HF_HUB_OFFLINE=1`` (``spec.model.offline``) the same call resolves the revision
from the cache alone. Failures become `HubError` with a reason and a message that says what to fix.

`place_in_cache` (`grpojob cache-model`) puts a local model directory into a cache in the hub's layout
(blobs, a snapshot of symlinks, a ref), with `huggingface_hub`'s own layout functions, so an air-gapped
cluster (and the tests, which have no network) can name a model by id.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path


class HubError(Exception):
    """The model could not be had; ``reason`` is a CamelCase word for a condition, the message says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Snapshot:
    """One commit of a model in a hub cache."""

    model_id: str
    commit: str
    path: Path
    """The snapshot directory: a Hugging Face model directory (symlinks into the cache's blobs)."""


def download_model(
    model_id: str, revision: str | None, cache_dir: str | os.PathLike[str], *, offline: bool = False
) -> Snapshot:
    """Download ``revision`` (default `main`) of ``model_id`` into the hub cache ``cache_dir`` (the token, if
    any, from ``HF_TOKEN``), or with ``offline`` (or ``HF_HUB_OFFLINE=1``) find it there. Raises `HubError`."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    revision = revision or "main"
    has_token = bool(os.environ.get("HF_TOKEN"))
    try:
        path = snapshot_download(model_id, revision=revision, cache_dir=cache_dir, local_files_only=offline)
    except GatedRepoError:
        hint = "the token of spec.model.tokenSecret has no access" if has_token else "set spec.model.tokenSecret"
        raise HubError("ModelAccessDenied", f"{model_id} is a gated model that needs a token: {hint}") from None
    except RevisionNotFoundError:
        raise HubError("ModelRevisionNotFound", f"{model_id} has no revision {revision!r}") from None
    except RepositoryNotFoundError:
        hint = (
            "or the token of spec.model.tokenSecret cannot see it"
            if has_token
            else "or it is private and needs spec.model.tokenSecret"
        )
        raise HubError("ModelNotFound", f"no model {model_id!r} on the Hugging Face hub ({hint})") from None
    except LocalEntryNotFoundError as error:
        if offline or _hub_offline():
            raise HubError(
                "ModelNotInCache",
                f"the cache does not hold {model_id} at revision {revision!r}, and spec.model.offline is true",
            ) from None
        raise HubError("HubUnreachable", f"could not download {model_id}: {error}") from None
    path = Path(path)
    return Snapshot(model_id=model_id, commit=path.name, path=path)


def _hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def place_in_cache(
    model_dir: str | os.PathLike[str], model_id: str, cache_dir: str | os.PathLike[str], revision: str = "main"
) -> Snapshot:
    """Put the files of ``model_dir`` into the hub cache ``cache_dir`` as ``model_id`` at ``revision``, as a
    download would leave them: each file a blob named by its SHA-256, a snapshot directory of symlinks
    under a commit id (a SHA-1 of the files' names and hashes), and the ref ``revision`` → that commit."""
    from huggingface_hub.file_download import (
        _cache_commit_hash_for_specific_revision,
        _create_symlink,
        repo_folder_name,
    )

    files = sorted(p for p in Path(model_dir).rglob("*") if p.is_file())
    if not files:
        raise FileNotFoundError(f"{model_dir} holds no files")
    hashes = {file: _sha256(file) for file in files}
    commit = hashlib.sha1(
        "".join(f"{f.relative_to(model_dir)}:{h}\n" for f, h in hashes.items()).encode(), usedforsecurity=False
    ).hexdigest()
    storage = Path(cache_dir) / repo_folder_name(repo_id=model_id, repo_type="model")
    for file, digest in hashes.items():
        blob = storage / "blobs" / digest
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.write_bytes(file.read_bytes())
        pointer = storage / "snapshots" / commit / file.relative_to(model_dir)
        pointer.parent.mkdir(parents=True, exist_ok=True)
        _create_symlink(str(blob), str(pointer), new_blob=False)
    _cache_commit_hash_for_specific_revision(str(storage), revision, commit)
    return Snapshot(model_id=model_id, commit=commit, path=storage / "snapshots" / commit)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
