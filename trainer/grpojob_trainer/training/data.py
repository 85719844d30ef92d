"""The prompt dataset: rows in NeMo Gym's format, served in shuffled epochs with a resumable position; and
several of them (`spec.dataset.sources`), each prompt of a batch drawn from one by weight.

A mixture's draw depends on the seed and the batch's number only, and each source keeps its own epoch and
index, so the position a checkpoint stores (`MixPosition.as_dict`: the batches drawn and every source's
place) makes a resumed run draw exactly the prompts an uninterrupted one would.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from grpojob_trainer.nemo_gym.protocol import Row, describe


@dataclass
class DataPosition:
    """Where the next batch starts: the epoch (which fixes the shuffle) and the index within it."""

    epoch: int = 0
    index: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}


class Position(Protocol):
    def as_dict(self) -> dict[str, Any]:
        """The position as a checkpoint stores it (JSON)."""
        ...


class Prompts(Protocol):
    """What the GRPO loop draws each step's prompts from: one dataset, or a mixture of several."""

    @property
    def position(self) -> Position:
        """Where the next batch starts."""
        ...

    def next_batch(self, size: int) -> list[Row]:
        """The next ``size`` rows."""
        ...

    def restore(self, position: Mapping[str, Any]) -> None:
        """Continue from a position saved in a checkpoint."""
        ...


class PromptDataset:
    """Rows of one source, each epoch in an order fixed by ``seed`` and the epoch number."""

    def __init__(self, rows: list[Row], seed: int = 0) -> None:
        if not rows:
            raise ValueError("the dataset has no rows")
        self.rows = rows
        self.seed = seed
        self.position = DataPosition()
        self._shuffled: tuple[int, list[int]] | None = None

    @classmethod
    def from_jsonl(cls, path: str | Path, seed: int = 0) -> PromptDataset:
        """Read every row; raises `ValueError` naming the line and the field of the first that is not a
        NeMo Gym row."""
        rows = []
        for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(Row.model_validate_json(line))
            except ValidationError as error:
                raise ValueError(f"{path}:{number}: not a NeMo Gym row: {describe(error)}") from None
        return cls(rows, seed)

    def _order(self, epoch: int) -> list[int]:
        if self._shuffled is None or self._shuffled[0] != epoch:
            order = list(range(len(self.rows)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._shuffled = (epoch, order)
        return self._shuffled[1]

    def next_batch(self, size: int) -> list[Row]:
        """The next ``size`` rows, crossing into the next epoch (reshuffled) when one runs out."""
        batch = []
        while len(batch) < size:
            order = self._order(self.position.epoch)
            take = order[self.position.index : self.position.index + size - len(batch)]
            batch += [self.rows[i] for i in take]
            self.position.index += len(take)
            if self.position.index >= len(order):
                self.position = DataPosition(self.position.epoch + 1, 0)
        return batch

    def restore(self, position: Mapping[str, Any]) -> None:
        """Continue from a position saved in a checkpoint."""
        self.position = DataPosition(int(position.get("epoch", 0)), int(position.get("index", 0)))


@dataclass
class MixPosition:
    """Where a mixture's next batch starts: how many batches it drew (which fixes the next draw) and each
    source's own position."""

    batches: int = 0
    sources: list[DataPosition] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "sources": [source.as_dict() for source in self.sources]}


def draw_sources(weights: Sequence[float], seed: int, batch: int, size: int) -> list[int]:
    """Which source each of the ``size`` prompts of batch number ``batch`` comes from: each one independently,
    with probability its weight over their sum, from a generator seeded by ``seed`` and ``batch`` alone."""
    rng = random.Random(f"grpojob-dataset-mix:{seed}:{batch}")
    return rng.choices(range(len(weights)), weights=weights, k=size)


class MixedPromptDataset:
    """Several sources, each prompt of a batch drawn from one of them by weight (`draw_sources`); each source
    serves its rows in its own shuffled epochs (`PromptDataset`)."""

    def __init__(self, sources: Sequence[PromptDataset], weights: Sequence[float], seed: int = 0) -> None:
        if not sources or len(sources) != len(weights):
            raise ValueError(f"{len(sources)} sources and {len(weights)} weights: one weight per source")
        if any(not weight > 0 for weight in weights):
            raise ValueError(f"every weight must be greater than 0: {list(weights)}")
        self.sources = list(sources)
        self.weights = list(weights)
        self.seed = seed
        self.batches = 0

    @property
    def position(self) -> MixPosition:
        return MixPosition(self.batches, [DataPosition(s.position.epoch, s.position.index) for s in self.sources])

    def next_batch(self, size: int) -> list[Row]:
        """The next ``size`` rows: for each, the next row of the source drawn for its place."""
        picks = draw_sources(self.weights, self.seed, self.batches, size)
        taken = {source: iter(self.sources[source].next_batch(count)) for source, count in Counter(picks).items()}
        self.batches += 1
        return [next(taken[source]) for source in picks]

    def restore(self, position: Mapping[str, Any]) -> None:
        """Continue from a position saved in a checkpoint; a source the checkpoint does not know (one added
        since) starts at its beginning."""
        self.batches = int(position.get("batches", 0))
        saved = list(position.get("sources", []))
        for index, source in enumerate(self.sources):
            source.restore(saved[index] if index < len(saved) else {})


def position_metrics(position: Mapping[str, Any]) -> dict[str, float]:
    """The metrics of a dataset position: `data/epoch` and `data/index` of one source; of a mixture, the
    batches drawn and `data/source_<i>/epoch`, `data/source_<i>/index` of each source."""
    if "sources" not in position:
        return {"data/epoch": position.get("epoch", 0), "data/index": position.get("index", 0)}
    metrics = {"data/batches": position.get("batches", 0)}
    for index, source in enumerate(position["sources"]):
        metrics[f"data/source_{index}/epoch"] = source.get("epoch", 0)
        metrics[f"data/source_{index}/index"] = source.get("index", 0)
    return metrics
