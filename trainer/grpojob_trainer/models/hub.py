"""Hugging Face ids: the one download of what a job names by id (its model, its datasets) into a hub cache,
and filling a cache offline.

`download` is what the download step of a job (`grpojob download`) runs for each repository:
`huggingface_hub`'s own `snapshot_download` into the cache volume, which resolves the revision to one
commit; every pod of the job then reads that commit's snapshot directory
(`grpojob_api.paths.hub_snapshot_path`) with ``HF_HUB_OFFLINE=1``. Offline (``spec.model.offline``, a
dataset's ``offline``, or ``HF_HUB_OFFLINE=1``) the same call resolves the revision from the cache alone.
Failures become `HubError` with a reason (`ModelNotFound`, `DatasetAccessDenied`, ...) and a message that
says what to fix.

`place_in_cache` (`grpojob cache-model`, `grpojob cache-dataset`) puts a local directory into a cache in the
hub's layout (blobs, a snapshot of symlinks, a ref), with `huggingface_hub`'s own layout functions, so an
air-gapped cluster (and the tests, which have no network) can name a model or a dataset by id.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

RepoType = Literal["model", "dataset"]
DATASET_CARD = "README.md"
"""A dataset's card: its configurations (`configs:` in its YAML header), which `datasets` reads."""


class HubError(Exception):
    """The repository could not be had; ``reason`` is a CamelCase word for a condition, the message says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Snapshot:
    """One commit of a model or dataset in a hub cache."""

    repo_id: str
    commit: str
    path: Path
    """The snapshot directory: the repository's files (symlinks into the cache's blobs)."""


def download_model(
    model_id: str, revision: str | None, cache_dir: str | os.PathLike[str], *, offline: bool = False
) -> Snapshot:
    """Download ``revision`` (default `main`) of the model ``model_id`` into the hub cache ``cache_dir`` (the
    token, if any, from ``HF_TOKEN``), or with ``offline`` (or ``HF_HUB_OFFLINE=1``) find it there. Raises
    `HubError`."""
    return download(model_id, revision, cache_dir, offline=offline)


def download(
    repo_id: str,
    revision: str | None,
    cache_dir: str | os.PathLike[str],
    *,
    repo_type: RepoType = "model",
    offline: bool = False,
    token: str | None = None,
    files: Sequence[str] | None = None,
    field: str | None = None,
) -> Snapshot:
    """Download ``revision`` (default `main`) of ``repo_id``, a model or a dataset (``repo_type``), into the
    hub cache ``cache_dir``, with ``token`` (default: ``HF_TOKEN``'s); with ``offline`` (or
    ``HF_HUB_OFFLINE=1``) find it there. ``files``: only these files (or globs), and a dataset's card.
    ``field`` is the spec field that names it (`spec.model`, `spec.dataset.sources[1]`), for messages.
    Raises `HubError`."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    revision = revision or "main"
    kind, field = repo_type.capitalize(), field or f"spec.{repo_type}"
    has_token = bool(token or os.environ.get("HF_TOKEN"))
    patterns = [*files, DATASET_CARD] if files is not None else None
    try:
        path = snapshot_download(
            repo_id,
            repo_type=repo_type,
            revision=revision,
            cache_dir=cache_dir,
            local_files_only=offline,
            token=token,
            allow_patterns=patterns,
        )
    except GatedRepoError:
        hint = f"the token of {field}.tokenSecret has no access" if has_token else f"set {field}.tokenSecret"
        message = f"{repo_id} is a gated {repo_type} that needs a token: {hint}"
        raise HubError(f"{kind}AccessDenied", message) from None
    except RevisionNotFoundError:
        raise HubError(f"{kind}RevisionNotFound", f"{repo_id} has no revision {revision!r}") from None
    except RepositoryNotFoundError:
        hint = (
            f"or the token of {field}.tokenSecret cannot see it"
            if has_token
            else f"or it is private and needs {field}.tokenSecret"
        )
        raise HubError(f"{kind}NotFound", f"no {repo_type} {repo_id!r} on the Hugging Face hub ({hint})") from None
    except LocalEntryNotFoundError as error:
        if offline or _hub_offline():
            raise HubError(
                f"{kind}NotInCache",
                f"the cache does not hold the {repo_type} {repo_id} at revision {revision!r}, and {field}.offline "
                "is true",
            ) from None
        raise HubError("HubUnreachable", f"could not download {repo_id}: {error}") from None
    path = Path(path)
    return Snapshot(repo_id=repo_id, commit=path.name, path=path)


def _hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def place_in_cache(
    directory: str | os.PathLike[str],
    repo_id: str,
    cache_dir: str | os.PathLike[str],
    revision: str = "main",
    repo_type: RepoType = "model",
) -> Snapshot:
    """Put the files of ``directory`` into the hub cache ``cache_dir`` as the model (or dataset: ``repo_type``)
    ``repo_id`` at ``revision``, as a download would leave them: each file a blob named by its SHA-256, a
    snapshot directory of symlinks under a commit id (a SHA-1 of the files' names and hashes), and the ref
    ``revision`` → that commit."""
    from huggingface_hub.file_download import (
        _cache_commit_hash_for_specific_revision,
        _create_symlink,
        repo_folder_name,
    )

    files = sorted(p for p in Path(directory).rglob("*") if p.is_file())
    if not files:
        raise FileNotFoundError(f"{directory} holds no files")
    hashes = {file: _sha256(file) for file in files}
    commit = hashlib.sha1(
        "".join(f"{f.relative_to(directory)}:{h}\n" for f, h in hashes.items()).encode(), usedforsecurity=False
    ).hexdigest()
    storage = Path(cache_dir) / repo_folder_name(repo_id=repo_id, repo_type=repo_type)
    for file, digest in hashes.items():
        blob = storage / "blobs" / digest
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.write_bytes(file.read_bytes())
        pointer = storage / "snapshots" / commit / file.relative_to(directory)
        pointer.parent.mkdir(parents=True, exist_ok=True)
        _create_symlink(str(blob), str(pointer), new_blob=False)
    _cache_commit_hash_for_specific_revision(str(storage), revision, commit)
    return Snapshot(repo_id=repo_id, commit=commit, path=storage / "snapshots" / commit)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
