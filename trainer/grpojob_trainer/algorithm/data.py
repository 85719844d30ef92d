"""The prompt dataset: JSONL rows in NeMo Gym's format, served in shuffled epochs with a resumable position."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from grpojob_trainer.nemo_gym.protocol import Row, describe


@dataclass
class DataPosition:
    """Where the next batch starts: the epoch (which fixes the shuffle) and the index within it."""

    epoch: int = 0
    index: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}


class PromptDataset:
    """Rows of a JSONL file, each epoch in an order fixed by ``seed`` and the epoch number."""

    def __init__(self, rows: list[Row], seed: int = 0) -> None:
        if not rows:
            raise ValueError("the dataset has no rows")
        self.rows = rows
        self.seed = seed
        self.position = DataPosition()

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
        order = list(range(len(self.rows)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

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

    def restore(self, position: dict[str, Any]) -> None:
        """Continue from a position saved in a checkpoint."""
        self.position = DataPosition(int(position.get("epoch", 0)), int(position.get("index", 0)))
