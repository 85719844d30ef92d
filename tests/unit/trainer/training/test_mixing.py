"""Several weighted sources (`spec.dataset.sources`): each step's prompts are drawn from the sources by their
weights, the same draws for the same seed; each source goes through its own rows in shuffled epochs; and a
run resumed from the position a checkpoint stores (JSON) draws exactly the prompts an uninterrupted run draws,
in order, across epochs of every source."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from grpojob_trainer.nemo_gym.protocol import Row
from grpojob_trainer.training.data import MixedPromptDataset, PromptDataset, draw_sources, position_metrics

BATCH = 16


def rows(source: str, count: int) -> list[Row]:
    return [Row.model_validate({"responses_create_params": {"input": f"{source}{i}"}}) for i in range(count)]


def mixture(seed: int = 7, weights: tuple[float, ...] = (3.0, 1.0, 0.5)) -> MixedPromptDataset:
    sizes = {"a": 40, "b": 7, "c": 3}  # b and c run out within a few steps: their epochs turn over
    sources = [PromptDataset(rows(name, size), seed + i) for i, (name, size) in enumerate(sizes.items())]
    return MixedPromptDataset(sources, list(weights), seed)


def prompts(batch: list[Row]) -> list[str]:
    return [str(row.responses_create_params.input) for row in batch]


def test_the_prompts_of_a_step_are_drawn_by_weight():
    draws = Counter(source for batch in range(400) for source in draw_sources([3.0, 1.0, 0.5], 7, batch, BATCH))
    total = sum(draws.values())
    for source, weight in enumerate([3.0, 1.0, 0.5]):
        assert draws[source] / total == pytest.approx(weight / 4.5, abs=0.02), draws
    mixed = mixture()
    drawn = [p[0] for _ in range(50) for p in prompts(mixed.next_batch(BATCH))]
    assert Counter(drawn)["a"] / len(drawn) == pytest.approx(3 / 4.5, abs=0.05)


def test_the_draws_follow_from_the_seed_alone():
    first, again, other = mixture(seed=7), mixture(seed=7), mixture(seed=8)
    ours = [prompts(first.next_batch(BATCH)) for _ in range(10)]
    assert ours == [prompts(again.next_batch(BATCH)) for _ in range(10)]
    assert ours != [prompts(other.next_batch(BATCH)) for _ in range(10)]


def test_each_source_serves_every_row_once_an_epoch():
    mixed = mixture()
    drawn = [p for _ in range(30) for p in prompts(mixed.next_batch(BATCH))]
    position = mixed.position.as_dict()
    small = [p for p in drawn if p.startswith("c")]
    epochs = position["sources"][2]["epoch"]
    assert epochs >= 2
    for epoch in range(epochs):
        assert sorted(small[epoch * 3 : epoch * 3 + 3]) == ["c0", "c1", "c2"], small  # each epoch a permutation


@pytest.mark.parametrize("stop", [1, 4, 9])
def test_a_resumed_run_draws_the_prompts_an_uninterrupted_one_draws(stop: int):
    uninterrupted = mixture()
    expected = [prompts(uninterrupted.next_batch(BATCH)) for _ in range(12)]

    first = mixture()
    for _ in range(stop):
        first.next_batch(BATCH)
    saved = json.loads(json.dumps({**first.position.as_dict(), "evaluation": {"best": None}}))  # a checkpoint
    resumed = mixture()
    resumed.restore(saved)

    assert [prompts(resumed.next_batch(BATCH)) for _ in range(stop, 12)] == expected[stop:]
    assert saved["batches"] == stop and len(saved["sources"]) == 3


def test_a_source_the_checkpoint_does_not_know_starts_at_its_beginning():
    mixed = mixture()
    mixed.restore({"batches": 2, "sources": [{"epoch": 1, "index": 5}]})
    position = mixed.position.as_dict()
    assert position["sources"] == [{"epoch": 1, "index": 5}, {"epoch": 0, "index": 0}, {"epoch": 0, "index": 0}]


def test_the_metrics_say_where_each_source_is():
    mixed = mixture()
    mixed.next_batch(BATCH)
    metrics = position_metrics(mixed.position.as_dict())
    assert metrics["data/batches"] == 1
    assert set(metrics) == {"data/batches"} | {f"data/source_{i}/{k}" for i in range(3) for k in ("epoch", "index")}
    assert position_metrics({"epoch": 2, "index": 3}) == {"data/epoch": 2, "data/index": 3}  # one source, as before


@pytest.mark.parametrize(("weights", "says"), [((1.0, 0.0, 1.0), "greater than 0"), ((1.0,), "one weight per source")])
def test_weights_that_cannot_draw_are_refused(weights, says):
    with pytest.raises(ValueError, match=says):
        mixture(weights=weights)
