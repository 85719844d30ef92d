"""The rows of a job's dataset, read where each source is: a JSONL file (a path, a ConfigMap's key), or the
snapshot directory of a Hugging Face dataset named by id, read with `datasets` (`load_dataset(<snapshot>,
name=config, split=split, data_files=files)`; a local directory, so nothing reaches for the hub). A source
with a `mapping` holds plain columns, made into NeMo Gym rows (`grpojob_trainer.training.mapping`);
without one its records must be NeMo Gym rows. Every error names the source's field and the record.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from grpojob_api import v1alpha1 as api
from grpojob_trainer.nemo_gym.protocol import Row, describe
from grpojob_trainer.training.data import MixedPromptDataset, PromptDataset, Prompts
from grpojob_trainer.training.mapping import MappingError, mapped_row


def load_prompts(dataset: api.DatasetSpec, locations: Sequence[str | Path], seed: int) -> Prompts:
    """The training prompts of ``dataset``, its sources read from ``locations`` (in its order): one source's
    rows in shuffled epochs, or several sources drawn from by their weights."""
    sources = dataset.all_sources()
    if len(sources) != len(locations):
        raise ValueError(f"spec.dataset has {len(sources)} sources, and {len(locations)} locations were given")
    fields = dataset.source_fields()
    if dataset.sources is None:
        return PromptDataset(load_rows(sources[0], locations[0], fields[0]), seed)
    loaded = [
        PromptDataset(load_rows(source, location, field), seed + index)
        for index, (source, location, field) in enumerate(zip(sources, locations, fields, strict=True))
    ]
    return MixedPromptDataset(loaded, dataset.weights(), seed)


def load_rows(source: api.DatasetSource, location: str | Path, field: str) -> list[Row]:
    """Every row of ``source``, read from ``location`` (its file, or its snapshot directory); ``field`` is the
    source's field path (`spec.dataset.sources[1]`) for messages. Raises ValueError naming the field and the
    record."""
    rows = []
    for where, record in _records(source, Path(location), field):
        try:
            if source.mapping is not None:
                row = Row.model_validate(mapped_row(_as_record(record), source.mapping))
            elif isinstance(record, str):
                row = Row.model_validate_json(record)
            else:
                row = Row.model_validate(_without_nulls(record))
        except MappingError as error:
            raise ValueError(f"{field}.mapping.{error} ({where})") from None
        except (ValidationError, ValueError) as error:
            problem = describe(error) if isinstance(error, ValidationError) else str(error)
            what = "not a record" if source.mapping is not None else "not a NeMo Gym row"
            hint = "" if source.mapping is not None else " (give the source a mapping for plain prompt columns)"
            raise ValueError(f"{field}: {where}: {what}{hint}: {problem}") from None
        rows.append(row)
    if not rows:
        raise ValueError(f"{field}: {location} holds no rows")
    return rows


def _records(source: api.DatasetSource, location: Path, field: str) -> Iterator[tuple[str, str | dict[str, Any]]]:
    """Each record with where it is: a JSONL line as its text, a hub dataset's row as a dict."""
    if source.id is None:
        try:
            text = location.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"{field}: cannot read {location}: {error}") from None
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                yield f"{location}:{number}", line
        return
    for number, record in enumerate(_hub_records(source, location, field)):
        yield f"row {number} of {source.id} ({source.split})", record


def _hub_records(source: api.DatasetSource, snapshot: Path, field: str) -> list[dict[str, Any]]:
    """The split of a hub dataset's snapshot, read by `datasets` into a cache of its own that goes after."""
    import datasets
    from datasets.exceptions import DatasetsError

    if not snapshot.is_dir():
        raise ValueError(f"{field}: {snapshot}, the snapshot of {source.id}, is not a directory")
    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory(prefix="grpojob-datasets-") as cache:
        try:
            loaded = datasets.load_dataset(
                str(snapshot),
                name=source.config,
                split=source.split,
                data_files=list(source.files) if source.files is not None else None,
                cache_dir=cache,
            )
        except (DatasetsError, ValueError, OSError) as error:
            what = f"{source.id} (config {source.config or 'default'}, split {source.split})"
            raise ValueError(f"{field}: datasets could not read {what} from {snapshot}: {error}") from None
        return loaded.to_list()


def _as_record(record: str | dict[str, Any]) -> Mapping[str, Any]:
    if isinstance(record, dict):
        return record
    value = json.loads(record)
    if not isinstance(value, dict):
        raise ValueError(f"a JSON object per line, not {type(value).__name__}")
    return value


def _without_nulls(value: Any) -> Any:
    """A record as `datasets` gives it without its nulls: Arrow gives every row of a table every key that
    any row has (null where it had none), which a NeMo Gym row would refuse (`parallel_tool_calls: null`)."""
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value
