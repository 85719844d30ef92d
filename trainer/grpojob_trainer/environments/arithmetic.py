"""Single-turn task with a verifiable answer: "What is 3+4?" → "7".

Built so that GRPO lifts the mean reward of a randomly initialised tiny model within minutes: the
reward gives partial credit a random policy sometimes earns, and each component points the same way
(answer with digits, include the right digit, say nothing else).
"""

from __future__ import annotations

import random
from typing import Any

from grpojob_trainer.environments.base import AnswerTask, ExampleEnvironment, Verdict, final_answer
from grpojob_trainer.nemo_gym.protocol import make_row

DIGITS_WEIGHT = 0.2
CONTAINS_WEIGHT = 0.3
EXACT_WEIGHT = 0.5


def score_answer(text: str, expected: str) -> dict[str, float]:
    """Reward components of an answer (they sum to at most 1.0).

    - ``digits``: 0.2 x the fraction of the answer's non-space characters that are digits;
    - ``contains``: 0.3 when the expected digits appear in the answer;
    - ``exact``: 0.5 when the answer, stripped, is exactly the expected digits.
    """
    stripped = text.strip()
    characters = [c for c in stripped if not c.isspace()]
    digits = sum(c.isdigit() for c in characters) / len(characters) if characters else 0.0
    return {
        "digits": DIGITS_WEIGHT * digits,
        "contains": CONTAINS_WEIGHT * (expected in stripped),
        "exact": EXACT_WEIGHT * (stripped == expected),
    }


class ArithmeticEnvironment(ExampleEnvironment):
    """Add two digits whose sum is a single digit; the expected answer is that digit."""

    name = "arithmetic"
    task = AnswerTask
    max_model_calls = 1

    def make_row(self, rng: random.Random) -> dict[str, Any]:
        """A row asking for ``a+b`` with ``a + b <= 9``."""
        a = rng.randint(0, 9)
        b = rng.randint(0, 9 - a)
        return make_row(self.name, f"What is {a}+{b}?", expected_answer=str(a + b))

    def verify(self, row: dict[str, Any], response: dict[str, Any], session: dict[str, Any]) -> Verdict:
        """Score the last assistant message against ``expected_answer``."""
        return Verdict(score_answer(final_answer(response), str(row["expected_answer"])))
