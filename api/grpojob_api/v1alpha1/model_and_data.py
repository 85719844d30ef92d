"""The model and the data of a GRPOJob: `spec.model` (a model directory or a Hugging Face model id, and the
job's Hugging Face cache) and `spec.dataset` (rows from a file, a ConfigMap or a Hugging Face dataset, one
source or several by weight, plain columns mapped into NeMo Gym rows).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from grpojob_api.v1alpha1.base import (
    MAX_PATH_LENGTH,
    ApiModel,
    PositiveQuantity,
    PvcSource,
    SecretKeyRef,
    cel,
    cel_rules,
    stays_inside,
)

HUB_MODEL_ID = r"^[A-Za-z0-9][-_.A-Za-z0-9]*(/[A-Za-z0-9][-_.A-Za-z0-9]*)?$"
"""A Hugging Face model id: `name` or `owner/name` (letters, digits, `-`, `_`, `.`)."""
_ONE_MODEL_SOURCE = "spec.model: set exactly one of path (a model directory) or id (a Hugging Face model id)"
_MODEL_PVC_NEEDS_PATH = "spec.model.pvc needs spec.model.path (the model directory inside the claim)"
_HUB_FIELDS_NEED_ID = "spec.model: revision, tokenSecret and offline go with id (a Hugging Face model id)"


class ModelCacheSpec(ApiModel):
    """The volume the job's Hugging Face downloads go to (in the hub's cache layout), once per job: the model
    and the datasets named by id share it. A claim the user names (shared by jobs, so a model or dataset is
    downloaded once), or one the job creates and deletes."""

    claim_name: str | None = Field(default=None, min_length=1)
    """An existing PersistentVolumeClaim to use as the cache (ReadWriteMany to share it between nodes). Without
    it the job creates `<job>-model-cache`, which goes with the job."""
    size: PositiveQuantity = "64Gi"
    """Size of the claim the job creates (ignored with `claimName`)."""
    storage_class_name: str | None = Field(default=None, min_length=1)
    """StorageClass of the claim the job creates (the cluster's default without it)."""
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany"] = "ReadWriteOnce"
    """Access mode of the claim the job creates: ReadWriteMany when the Ray pods span several nodes."""


class ModelSpec(ApiModel):
    """The policy model: a Hugging Face model directory (weights, config, tokenizer, chat template), named
    one of three ways: a Hugging Face model `id` (downloaded once into a cache volume before any pod needs
    it); a `path` (on a `pvc`) to a model directory; or a `path` to an earlier job's exported model or
    checkpoint, to continue training from it."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel("has(self.path) != has(self.id)", _ONE_MODEL_SOURCE),
            cel("!has(self.pvc) || has(self.path)", _MODEL_PVC_NEEDS_PATH, ".pvc"),
            cel(
                "has(self.id) || !(has(self.revision) || has(self.tokenSecret) || (has(self.offline) && self.offline))",
                _HUB_FIELDS_NEED_ID,
            ),
        )
    )

    path: str | None = Field(default=None, min_length=1, max_length=MAX_PATH_LENGTH)
    """Local path of the model directory (a Hugging Face model directory, an exported model or a checkpoint
    of an earlier job); with `pvc`, the path inside the claim."""
    pvc: PvcSource | None = None
    """Claim holding `path`; mounted read-only into the Ray pods and the trainer."""
    id: str | None = Field(default=None, max_length=96, pattern=HUB_MODEL_ID)
    """A Hugging Face model id (`Qwen/Qwen2.5-1.5B-Instruct`): the operator downloads it into `cache` before
    the Ray pods start, and every pod loads that one revision from there, with `HF_HUB_OFFLINE=1`."""
    revision: str | None = Field(default=None, min_length=1, max_length=255, pattern=r"^[^\s]+$")
    """Branch, tag or commit of `id` (default `main`); resolved to one commit by the download."""
    token_secret: SecretKeyRef | None = None
    """The Secret key holding a Hugging Face token (`HF_TOKEN`), for gated or private models."""
    cache: ModelCacheSpec | None = None
    """The job's Hugging Face cache: where `id`, and the datasets named by id, are downloaded to (default: a
    claim the job creates). Also with a `path` model when a dataset is named by id."""
    offline: bool = False
    """Take `id` from the cache only, never from the hub (a cache filled beforehand, an air-gapped
    cluster): the download step fails with a clear reason when the cache does not hold it."""
    served_model_name: str = Field(default="policy", min_length=1, max_length=128)
    """Name the generation server answers to (`model` in OpenAI requests, `/v1/models`)."""

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.path is None) == (self.id is None):
            raise ValueError(_ONE_MODEL_SOURCE)
        if self.pvc is not None and self.path is None:
            raise ValueError(_MODEL_PVC_NEEDS_PATH)
        hub_fields = self.revision or self.token_secret or self.offline
        if self.id is None and hub_fields:
            raise ValueError(_HUB_FIELDS_NEED_ID)
        return self


class ConfigMapSource(ApiModel):
    name: str = Field(min_length=1)
    """ConfigMap in the GRPOJob's namespace."""
    key: str = Field(default="train.jsonl", min_length=1)
    """Key holding the JSONL rows."""


ROW_KEYS = ("responses_create_params", "agent_ref")
"""The keys of a NeMo Gym row that a mapping writes itself (the prompt and the environment)."""
_ROW_KEYS_RESERVED = "responses_create_params and agent_ref are written by the mapping itself"

MappedColumn = Annotated[str, Field(min_length=1, max_length=256)]


class DatasetMapping(ApiModel):
    """Plain prompt columns made into NeMo Gym rows: each record becomes `responses_create_params.input` =
    [a system message (`systemPrompt`), a user message (the `promptField` column)], `agent_ref.name` =
    `environment`, and the task fields its environment verifies with (`fields`, e.g. the expected answer)."""

    prompt_field: str = Field(min_length=1, max_length=256)
    """The column holding the user prompt."""
    system_prompt: str | None = Field(default=None, min_length=1, max_length=65536)
    """A system message before the prompt."""
    environment: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")
    """The environment that verifies these rows (a `spec.environments` name, or a NeMo Gym agent of one): the
    rows' `agent_ref.name`."""
    fields: dict[str, MappedColumn] = Field(
        default_factory=dict,
        max_length=64,
        json_schema_extra=cel_rules(
            cel("!('responses_create_params' in self) && !('agent_ref' in self)", _ROW_KEYS_RESERVED)
        ),
    )
    """Task fields of each row, by the column they come from (`{expected_answer: answer}`): what the
    environment needs to verify a rollout."""

    @field_validator("fields")
    @classmethod
    def _not_the_mappings_own(cls, fields: dict[str, str]) -> dict[str, str]:
        if set(fields) & set(ROW_KEYS):
            raise ValueError(_ROW_KEYS_RESERVED)
        return fields


HUB_DATASET_ID = HUB_MODEL_ID
"""A Hugging Face dataset id: `name` or `owner/name`."""
DATASET_SPLIT = r"^[A-Za-z0-9_.\-]+(\[[-0-9:%]*\])?(\+[A-Za-z0-9_.\-]+(\[[-0-9:%]*\])?)*$"
"""A split as `datasets` takes it: `train`, `test[:500]`, `train[10%:]`, `train+validation`."""
_ONE_DATASET_SOURCE = "set exactly one of path, configMap or id"
_ONE_DATASET_FORM = "set exactly one of path, configMap, id or sources"
_PVC_NEEDS_PATH = "pvc needs path (the file inside the claim)"
_ID_NEEDS_SPLIT = "id needs split (the split of the dataset to read, e.g. train)"
_DATASET_HUB_FIELDS_NEED_ID = (
    "revision, split, config, files, tokenSecret and offline go with id (a Hugging Face dataset id)"
)
_SOURCES_TAKE_THEIR_OWN_MAPPING = "mapping goes on each of sources, not beside them"


def _exactly_one(*fields: str) -> str:
    """A CEL rule: exactly one of ``fields`` is set."""
    return " + ".join(f"(has(self.{f}) ? 1 : 0)" for f in fields) + " == 1"


_DATASET_SOURCE_RULES = (
    cel("!has(self.pvc) || has(self.path)", _PVC_NEEDS_PATH, ".pvc"),
    cel(
        "has(self.id) || !(has(self.revision) || has(self.split) || has(self.config) || has(self.files) || "
        "has(self.tokenSecret) || (has(self.offline) && self.offline))",
        _DATASET_HUB_FIELDS_NEED_ID,
    ),
    cel("!has(self.id) || has(self.split)", _ID_NEEDS_SPLIT, ".split"),
)

_IN_DATASET_RULE, _IN_DATASET = stays_inside("the dataset")
DatasetFile = Annotated[
    str,
    Field(
        min_length=1,
        max_length=1024,
        pattern=r"^[^/]",
        json_schema_extra=_IN_DATASET_RULE,
    ),
    _IN_DATASET,
]
"""A file (or glob) inside a hub dataset's repository, relative to its root."""


class DatasetSource(ApiModel):
    """One source of rows, exactly one of: a JSONL file (`path`, inside `pvc` on Kubernetes), a `configMap` key
    of JSONL, or a Hugging Face dataset `id` (downloaded once before the job starts, into the job's Hugging
    Face cache, `spec.model.cache`). The rows are NeMo Gym rows (`responses_create_params`, `agent_ref`, task
    fields) as they are, or plain columns made into them by a `mapping`."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(_exactly_one("path", "configMap", "id"), _ONE_DATASET_SOURCE), *_DATASET_SOURCE_RULES
        )
    )

    path: str | None = Field(default=None, min_length=1, max_length=MAX_PATH_LENGTH)
    """Path of the JSONL file (local under `grpojob run`; inside `pvc` on Kubernetes)."""
    pvc: PvcSource | None = None
    """Claim holding `path`."""
    config_map: ConfigMapSource | None = None
    """ConfigMap holding the rows."""
    id: str | None = Field(default=None, max_length=96, pattern=HUB_DATASET_ID)
    """A Hugging Face dataset id (`openai/gsm8k`): the operator downloads it before the job starts, the
    trainer reads that one revision with `datasets` (`load_dataset(<snapshot>, name=config, split=split,
    data_files=files)`), offline. `grpojob run` takes it from this machine's hub cache only."""
    revision: str | None = Field(default=None, min_length=1, max_length=255, pattern=r"^[^\s]+$")
    """Branch, tag or commit of `id` (default `main`); resolved to one commit by the download
    (`status.datasetCommits`)."""
    split: str | None = Field(default=None, max_length=256, pattern=DATASET_SPLIT)
    """The split of `id` to read (`train`, `test[:500]`, `train+validation`): needed with `id`."""
    config: str | None = Field(default=None, min_length=1, max_length=256, pattern=r"^[^\s]+$")
    """The configuration of `id` (`name` in `load_dataset`: `main` of `openai/gsm8k`), as its card defines."""
    files: list[DatasetFile] | None = Field(default=None, min_length=1, max_length=64)
    """Files (or globs) of `id` to read (`data_files` in `load_dataset`); only these, and the card, are
    downloaded."""
    token_secret: SecretKeyRef | None = None
    """The Secret key holding a Hugging Face token for a gated or private `id` (default: the model's,
    `spec.model.tokenSecret`, when it has one)."""
    offline: bool = False
    """Take `id` from the cache only, never from the hub (a cache filled beforehand with `grpojob cache-dataset`
    or `hf download --repo-type dataset`)."""
    mapping: DatasetMapping | None = None
    """Make plain prompt columns into NeMo Gym rows; without it the rows must be NeMo Gym rows already."""

    @model_validator(mode="after")
    def _one_source(self) -> DatasetSource:
        _check_source(self, (self.path, self.config_map, self.id), _ONE_DATASET_SOURCE)
        return self


def _check_source(source: DatasetSource, kinds: tuple[object, ...], exactly_one: str) -> None:
    """The rules of one source (`_DATASET_SOURCE_RULES`), with ``kinds`` the forms of which one must be set."""
    if sum(kind is not None for kind in kinds) != 1:
        raise ValueError(exactly_one)
    if source.pvc is not None and source.path is None:
        raise ValueError(_PVC_NEEDS_PATH)
    hub_fields = (source.revision, source.split, source.config, source.files, source.token_secret)
    if source.id is None and (any(f is not None for f in hub_fields) or source.offline):
        raise ValueError(_DATASET_HUB_FIELDS_NEED_ID)
    if source.id is not None and source.split is None:
        raise ValueError(_ID_NEEDS_SPLIT)


class WeightedDatasetSource(DatasetSource):
    """One of several sources of training rows (`spec.dataset.sources`), drawn from by its weight."""

    weight: float = Field(default=1.0, gt=0.0, le=1_000_000)
    """Its share of each step's prompts, relative to the other sources' weights: each prompt of a step comes
    from this source with probability weight / (the sum of the weights), drawn from `spec.grpo.seed`."""


class DatasetSpec(DatasetSource):
    """Training rows: one source (`path`, `configMap` or `id`, as `DatasetSource` says), or several weighted
    `sources` that each step's prompts are drawn from by weight."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(_exactly_one("path", "configMap", "id", "sources"), _ONE_DATASET_FORM),
            *_DATASET_SOURCE_RULES,
            cel("!has(self.sources) || !has(self.mapping)", _SOURCES_TAKE_THEIR_OWN_MAPPING, ".mapping"),
        )
    )

    sources: list[WeightedDatasetSource] | None = Field(default=None, min_length=1, max_length=16)
    """Several sources, each with a weight: every prompt of a step is drawn from one of them by weight
    (deterministically from `spec.grpo.seed` and the step), and each goes through its rows in its own
    shuffled epochs; a checkpoint keeps every source's place, so a resumed run draws the prompts an
    uninterrupted one would. Instead of `path`, `configMap` or `id`."""

    @model_validator(mode="after")
    def _one_source(self) -> DatasetSpec:
        _check_source(self, (self.path, self.config_map, self.id, self.sources), _ONE_DATASET_FORM)
        if self.sources is not None and self.mapping is not None:
            raise ValueError(_SOURCES_TAKE_THEIR_OWN_MAPPING)
        return self

    def all_sources(self) -> list[DatasetSource]:
        """The sources rows are drawn from: ``sources``, or this one."""
        return list(self.sources) if self.sources is not None else [self]

    def weights(self) -> list[float]:
        """Each source's weight (1 for a single source)."""
        return [s.weight for s in self.sources] if self.sources is not None else [1.0]

    def source_fields(self, prefix: str = "spec.dataset") -> list[str]:
        """Each source's field path, as messages name it: ``prefix``, or `prefix.sources[i]`."""
        return [f"{prefix}.sources[{i}]" for i in range(len(self.sources))] if self.sources is not None else [prefix]
