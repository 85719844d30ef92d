"""What a GRPOJob downloads from the Hugging Face hub before it starts, and what the download says it got.

One Job of the GRPOJob (`<job>-model`) downloads every repository the job names by id (the model,
`spec.model.id`, and each dataset: `spec.dataset`, each of its `sources`, `spec.evaluation.dataset`) into
the job's Hugging Face cache (`spec.model.cache`), with `grpojob download`, one `HubRepo` (as JSON) per
argument. Its report (`DownloadReport`, its termination message) holds the commit each revision resolved
to, in the order of the arguments, or why it failed. The operator keeps the commits in the status
(`modelCommit`; `datasetCommits` by `dataset_key`) and the pods read those snapshots. The operator writes
the arguments and reads the report with this module, and the download step reads the arguments and
writes the report with it, so both agree on each key.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from grpojob_api import v1alpha1 as api

MODEL_TOKEN_ENV = "HF_TOKEN"
"""The download pod's token of `spec.model.tokenSecret` (`huggingface_hub` reads it by default)."""
DATASET_TOKEN_ENV = "HF_TOKEN_{}"
"""The download pod's token of the n-th other Secret a dataset names (from 1)."""
DEFAULT_REVISION = "main"


class HubRepo(BaseModel):
    """One repository to download: a model or a dataset, at a revision, as the spec field ``field`` names it."""

    model_config = ConfigDict(frozen=True, alias_generator=to_camel, populate_by_name=True, extra="forbid")

    kind: Literal["model", "dataset"]
    id: str = Field(min_length=1)
    revision: str = DEFAULT_REVISION
    offline: bool = False
    """From the cache only, never from the hub."""
    token_env: str | None = None
    """The environment variable holding its token (none: `HF_TOKEN`'s, if any)."""
    files: tuple[str, ...] | None = None
    """Only these files (or globs) and the dataset card; None: the whole repository."""
    field: str = Field(min_length=1)
    """The spec field that names it (`spec.model`, `spec.dataset.sources[1]`), for messages."""

    @property
    def key(self) -> str:
        """`<id>@<revision>`: its key in `status.datasetCommits`."""
        return f"{self.id}@{self.revision}"

    def argument(self) -> str:
        """Its argument of `grpojob download` (JSON)."""
        return self.model_dump_json(by_alias=True, exclude_defaults=True)

    @classmethod
    def parse(cls, text: str) -> HubRepo:
        """An argument of `grpojob download`; raises ValueError naming what is wrong."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as error:
            raise ValueError(f"not a repository to download: {text!r}: {error}") from None


def dataset_key(source: api.DatasetSource) -> str:
    """`<id>@<revision>` of a dataset named by id: its key in `status.datasetCommits`."""
    return f"{source.id}@{source.revision or DEFAULT_REVISION}"


def token_secrets(job: api.GRPOJob) -> dict[str, api.SecretKeyRef]:
    """The download pod's token variables and the Secret key of each: the model's as `HF_TOKEN`, every other
    Secret a dataset names as `HF_TOKEN_<n>` (a dataset naming the model's shares `HF_TOKEN`)."""
    found: dict[str, api.SecretKeyRef] = {}
    model = job.spec.model
    if model.id is not None and model.token_secret is not None:
        found[MODEL_TOKEN_ENV] = model.token_secret
    for _, source in job.spec.hub_datasets():
        secret = source.token_secret
        if secret is not None and secret not in found.values():
            found[DATASET_TOKEN_ENV.format(sum(env != MODEL_TOKEN_ENV for env in found) + 1)] = secret
    return found


def hub_repos(job: api.GRPOJob) -> list[HubRepo]:
    """Every repository the job names by id, each once: the model, then the datasets in the order of the spec
    (a dataset several sources name at one revision once: offline only if all say so, its files all theirs)."""
    spec = job.spec
    repos: list[HubRepo] = []
    if spec.model.id is not None:
        token = MODEL_TOKEN_ENV if spec.model.token_secret is not None else None
        repos.append(
            HubRepo(
                kind="model",
                id=spec.model.id,
                revision=spec.model.revision or DEFAULT_REVISION,
                offline=spec.model.offline,
                token_env=token,
                field="spec.model",
            )
        )
    env_of = {(secret.name, secret.key): env for env, secret in token_secrets(job).items()}
    datasets: dict[str, HubRepo] = {}
    for field, source in spec.hub_datasets():
        secret = source.token_secret
        repo = HubRepo(
            kind="dataset",
            id=str(source.id),
            revision=source.revision or DEFAULT_REVISION,
            offline=source.offline,
            token_env=env_of[(secret.name, secret.key)] if secret is not None else None,
            files=tuple(source.files) if source.files is not None else None,
            field=field,
        )
        earlier = datasets.get(repo.key)
        datasets[repo.key] = repo if earlier is None else _merged(earlier, repo)
    return repos + list(datasets.values())


def _merged(first: HubRepo, second: HubRepo) -> HubRepo:
    """One download of a dataset two sources name at one revision."""
    files = None if first.files is None or second.files is None else tuple(dict.fromkeys(first.files + second.files))
    return first.model_copy(
        update={
            "offline": first.offline and second.offline,
            "token_env": first.token_env or second.token_env,
            "files": files,
        }
    )


class DownloadReport(BaseModel):
    """What `grpojob download` leaves in its termination message: each repository's commit, in the order of
    its arguments; or why it failed (a CamelCase reason and a message)."""

    model_config = ConfigDict(extra="ignore")

    commits: list[str] | None = None
    reason: str | None = None
    message: str | None = None
    commit: str | None = None
    """The model's commit, as `grpojob download-model` (and a download Job of an older operator) reports it."""

    def text(self) -> str:
        """The report as JSON (at most a few KiB: a termination message holds 4096 bytes)."""
        return self.model_dump_json(exclude_none=True)

    def commits_of(self, repos: list[HubRepo]) -> list[str] | None:
        """The commit of each of ``repos`` (the download's arguments), or None when the report does not hold
        them all."""
        if self.commits is not None:
            return self.commits if len(self.commits) == len(repos) and all(self.commits) else None
        if self.commit and [repo.kind for repo in repos] == ["model"]:
            return [self.commit]
        return None
