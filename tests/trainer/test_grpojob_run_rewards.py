"""`grpojob run` of the GSM8K example (examples/gsm8k.yaml) on the tiny model: a GSM8K-shaped dataset from a local
hub cache, its `question` and `answer` columns mapped to prompts and references, rewards from the example's
reward file and the built-in math and format checkers served by the reward server. The tiny model learns the
part of the reward it can (answering with digits); each function's mean is logged beside the total."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import yaml

from tests.trainer.test_grpojob_run import finish, grpojob

ROOT = Path(__file__).resolve().parents[2]
STEPS = int(os.environ.get("GRPOJOB_TEST_STEPS", "24"))


def gsm8k_shaped(directory: Path, rows: int, seed: int = 0) -> Path:
    """A dataset laid out as `openai/gsm8k` is (config `main`, a parquet file per split, answers ending in
    `#### N`), with small word problems of our own."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    questions, answers = [], []
    for _ in range(rows):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        questions.append(f"Tom has {a} apples and buys {b} more. How many?")
        answers.append(f"He has {a}+{b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}")
    (directory / "main").mkdir(parents=True)
    table = pa.table({"question": questions, "answer": answers})
    pq.write_table(table, directory / "main" / "train-00000-of-00001.parquet")
    card = "---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n    path: main/train-*\n---\n"
    (directory / "README.md").write_text(card + "Word problems shaped like GSM8K.\n")
    return directory


def test_grpojob_run_of_the_gsm8k_example_trains_on_its_reward_functions(tiny_model_dir: Path, tmp_path: Path):
    from grpojob_trainer.models.hub import place_in_cache

    cache = tmp_path / "hub"
    place_in_cache(gsm8k_shaped(tmp_path / "gsm8k", 256), "grpojob-tests/gsm8k", cache, repo_type="dataset")
    job = yaml.safe_load((ROOT / "examples" / "gsm8k.yaml").read_text())
    tiny = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())["spec"]
    spec = job["spec"]
    spec["model"] = {"path": str(tiny_model_dir), "servedModelName": "tiny"}
    spec["dataset"]["id"] = "grpojob-tests/gsm8k"
    spec["environments"][0]["rewards"]["path"] = str(ROOT / "examples" / "rewards" / "gsm8k.py")
    spec["generation"] = tiny["generation"] | {"maxModelLen": 512}
    spec["training"] = tiny["training"]
    spec["grpo"] = tiny["grpo"] | {"maxSteps": STEPS}
    spec["checkpointing"] = {"path": str(tmp_path / "checkpoints"), "interval": 100}
    path = tmp_path / "gsm8k.yaml"
    path.write_text(yaml.safe_dump(job))

    process = grpojob("run", str(path), "--out", str(tmp_path / "out"), cwd=tmp_path, hub_cache=cache)
    out = finish(process, 900)

    assert process.returncode == 0, out[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == STEPS
    assert all(step["rollout/failed"] == 0 for step in steps), "every rollout scored:\n" + out[-3000:]
    for function in ("math", "format", "numeric_answer"):
        assert all(f"reward/{function}/mean" in step for step in steps), function
    numeric = [step["reward/numeric_answer/mean"] for step in steps]
    total = [step["rollout/reward/mean"] for step in steps]
    first, last = sum(numeric[:6]) / 6, sum(numeric[-6:]) / 6
    assert last > first + 0.1, f"the share of digits in the answers did not rise: {numeric}"
    print(f"reward/numeric_answer/mean {first:.3f} -> {last:.3f}; total {total[0]:.3f} -> {total[-1]:.3f}")
