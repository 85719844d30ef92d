"""The built-in verifiers, with the signature of a user's reward function (TRL's): ``prompts``, ``completions``
and the row's other columns as keyword arguments, one reward (or None: does not apply) per completion.

- `math`: the completion's final answer equals the row's ``expected_answer`` by value (math-verify, as the
  open-source R1 reproductions check it: ``\\boxed{}``, fractions, LaTeX, plain numbers). The answer is the
  last ``<answer>…</answer>`` of the completion if it has one, else what follows its last ``####``, else the
  whole completion; a reference in GSM8K's form (the working, then ``#### 72``) counts from its ``####``.
  A row whose reference does not parse is not scored (None).
- `format`: 1.0 when the completion is ``<think>…</think>`` then ``<answer>…</answer>`` and nothing else.
- `code`: the completion's code (its last fenced code block, else all of it) with the row's ``tests`` (Python
  source, or a list of sources each scored on its own) run in the sandbox (`sandbox`): the share of tests
  that pass. A row without ``tests`` is not scored.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Sequence
from typing import Any

from grpojob_trainer.environments.rewards.sandbox import Limits, run_sandboxed

RewardFunction = Callable[..., list[float | None]]

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
FORMAT = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)
CODE_BLOCK = re.compile(r"```[A-Za-z0-9_+-]*[ \t]*\n(.*?)```", re.DOTALL)
GSM8K_ANSWER = "####"


def completion_text(completion: Any) -> str:
    """A completion as text: the string itself, or the contents of a conversational completion's messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence):
        return "".join(str(m.get("content") or "") for m in completion if isinstance(m, dict))
    return str(completion)


def final_answer(text: str) -> str:
    """The part of a completion or reference that holds its final answer."""
    answers = ANSWER.findall(text)
    if answers:
        return answers[-1]
    if GSM8K_ANSWER in text:
        return text.rsplit(GSM8K_ANSWER, 1)[1]
    return text


def math_reward(completions: list[Any], expected_answer: list[Any] | None = None, **_: Any) -> list[float | None]:
    """1.0 when the final answer equals ``expected_answer`` by value, 0.0 when not, None without a reference."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    if expected_answer is None:
        return [None] * len(completions)
    extraction = [LatexExtractionConfig(), ExprExtractionConfig()]
    rewards: list[float | None] = []
    for completion, reference in zip(completions, expected_answer, strict=True):
        gold = parse(final_answer(str(reference)), extraction) if reference is not None else []
        if not gold:
            rewards.append(None)
            continue
        answer = parse(final_answer(completion_text(completion)), extraction)
        rewards.append(1.0 if answer and verify(gold, answer) else 0.0)
    return rewards


def format_reward(completions: list[Any], **_: Any) -> list[float | None]:
    """1.0 for ``<think>…</think><answer>…</answer>`` (whitespace around and between allowed), else 0.0."""
    return [1.0 if FORMAT.match(completion_text(c)) else 0.0 for c in completions]


def code_of(text: str) -> str:
    """The code of a completion: its last fenced block, else the whole text."""
    blocks = CODE_BLOCK.findall(text)
    return blocks[-1] if blocks else text


def test_program(code: str, test: str, marker: str) -> str:
    """The program that runs ``code`` then ``test`` and prints ``marker`` only if both got to their end (so
    code that exits early, `sys.exit(0)` and all, does not pass)."""
    return f"{code}\n\n{test}\n\nprint({marker!r})\n"


def code_reward(limits: Limits) -> RewardFunction:
    """The `code` verifier with the sandbox's ``limits``."""

    def code(completions: list[Any], tests: list[Any] | None = None, **_: Any) -> list[float | None]:
        if tests is None:
            return [None] * len(completions)
        rewards: list[float | None] = []
        for completion, row_tests in zip(completions, tests, strict=True):
            if row_tests is None or row_tests == [] or row_tests == "":
                rewards.append(None)
                continue
            sources = [row_tests] if isinstance(row_tests, str) else [str(t) for t in row_tests]
            program = code_of(completion_text(completion))
            passed = 0
            for test in sources:
                marker = f"grpojob-passed-{secrets.token_hex(8)}"
                ran = run_sandboxed(test_program(program, test, marker), limits)
                passed += ran.returncode == 0 and ran.stdout.rstrip().endswith(marker)
            rewards.append(passed / len(sources))
        return rewards

    return code


def builtin(name: str, limits: Limits) -> RewardFunction:
    """The built-in verifier ``name``."""
    if name == "math":
        return math_reward
    if name == "format":
        return format_reward
    if name == "code":
        return code_reward(limits)
    raise KeyError(f"no built-in reward {name!r}")
