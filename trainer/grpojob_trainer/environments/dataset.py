"""Write an example environment's dataset: ``python -m grpojob_trainer.environments.dataset NAME --rows N --out F``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from grpojob_trainer.environments import ENVIRONMENTS, get_environment


def write_rows(name: str, count: int, path: str | Path, seed: int = 0) -> Path:
    """Write ``count`` JSONL rows of environment ``name`` (NeMo Gym's row format) to ``path``."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = get_environment(name).make_rows(count, seed)
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return out


def main(argv: list[str] | None = None) -> None:
    """Command line for `write_rows`."""
    parser = argparse.ArgumentParser(description="Write an example environment's JSONL rows")
    parser.add_argument("name", choices=sorted(ENVIRONMENTS))
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    print(f"wrote {args.rows} rows to {write_rows(args.name, args.rows, args.out, args.seed)}")


if __name__ == "__main__":
    main()
