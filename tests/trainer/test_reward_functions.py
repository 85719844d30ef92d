"""Reward functions as users write them, served by the reward server (real worker processes, the real generation
server for `/run`): what they score, and what the user sees when one goes wrong."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from grpojob_trainer.environments.app import AgentConfig, create_environment_app
from grpojob_trainer.environments.rewards import RewardFileError, RewardsConfig, RewardsEnvironment
from grpojob_trainer.experience.rollouts import collect_rollouts
from grpojob_trainer.nemo_gym.protocol import Row, make_row
from grpojob_trainer.net.http import ThreadedServer

FIVE_LINES = """
def short_answer(completions, **kwargs):
    # conversational prompts (a list of messages) get conversational completions, as in TRL
    return [1.0 if len(c[0]["content"]) < 10 else 0.0 for c in completions]
"""

BAD_FUNCTIONS = """
import asyncio, time

def raises(completions, **kwargs):
    return [kwargs["solution"] for c in completions]

def too_many(completions, **kwargs):
    return [1.0, 1.0]

def nan(completions, **kwargs):
    return [float("nan")]

def text(completions, **kwargs):
    return ["0.5"]

def slow(completions, **kwargs):
    time.sleep(60)

def nothing(completions, **kwargs):
    return [None]

async def awaited(completions, **kwargs):
    await asyncio.sleep(0)
    return [0.25]

def crash(completions, **kwargs):
    import os
    os._exit(3)
"""


@contextmanager
def reward_server(
    tmp_path: Path, source: str | None, functions: list[dict], policy_base_url: str = "http://127.0.0.1:9/v1", **extra
) -> Iterator[str]:
    """The reward server's URL, serving ``functions`` of a reward file holding ``source``."""
    file = None
    if source is not None:
        file = tmp_path / "rewards.py"
        file.write_text(textwrap.dedent(source))
    config = RewardsConfig.model_validate({"file": str(file) if file else None, "functions": functions, **extra})
    environment = RewardsEnvironment(config)
    environment.start()
    server = ThreadedServer(create_environment_app(environment, AgentConfig(policy_base_url))).start()
    try:
        yield server.url
    finally:
        server.stop()
        environment.stop()


def sampled(policy_sampling, row: dict) -> dict:
    """``row`` with the job's sampling parameters, as the rollout client sends it."""
    return policy_sampling.apply(Row.model_validate(row)).model_dump(mode="json", exclude_unset=True)


def verify_body(text: str, prompt: str = "What is 3+4?", **columns) -> dict:
    """A ``/verify`` body: a one-message prompt, the assistant's ``text``, the row's ``columns``."""
    answer = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
    return {**make_row("math", prompt, **columns), "response": {"output": [answer]}}


def verify(url: str, text: str, **columns) -> httpx.Response:
    return httpx.post(f"{url}/verify", json=verify_body(text, **columns), timeout=60)


def test_a_five_line_reward_file_scores_a_real_rollout_beside_a_builtin(tmp_path, generation_server, policy_sampling):
    functions = [{"name": "short_answer"}, {"builtin": "format", "weight": 0.5}]
    with reward_server(tmp_path, FIVE_LINES, functions, generation_server.base_url) as url:
        row = sampled(policy_sampling, make_row("gsm8k", "What is 3+4?", expected_answer="7"))
        result = httpx.post(f"{url}/run", json=row, timeout=60).json()

    text = result["response"]["output"][-1]["content"][0]["text"]
    assert result["reward_functions"] == {"short_answer": float(len(text) < 10), "format": 0.0}
    assert result["reward_components"] == {"short_answer": float(len(text) < 10), "format": 0.0}
    assert result["reward"] == float(len(text) < 10)
    assert result["expected_answer"] == "7", "the row comes back"
    assert result["response"]["output"][-1]["generation_token_ids"]


def test_the_math_verifier_compares_answers_by_value(tmp_path):
    gsm8k_reference = "Natalia sold 48/2 = 24 clips in May.\nShe sold 48+24 = 72 clips.\n#### 72"
    with reward_server(tmp_path, None, [{"builtin": "math"}]) as url:
        cases = {
            "So the answer is \\boxed{72}.": 1.0,
            "<think>48+24</think><answer>72</answer>": 1.0,
            "They sold 72.0 clips": 1.0,
            "#### 71": 0.0,
            "seventy-two": 0.0,
        }
        rewards = {text: verify(url, text, expected_answer=gsm8k_reference).json()["reward"] for text in cases}
        fraction = verify(url, "\\boxed{\\frac{3}{4}}", expected_answer="0.75").json()["reward"]
        unparsable = verify(url, "72", expected_answer="no number here", unrelated=1)

    assert rewards == cases
    assert fraction == 1.0
    assert unparsable.status_code == 422, "the only function does not apply: nothing to score"
    assert "no reward function applies" in unparsable.json()["error"]["message"]


def test_the_format_verifier_wants_think_then_answer(tmp_path):
    with reward_server(tmp_path, None, [{"builtin": "format"}]) as url:
        good = verify(url, "<think>\n3 plus 4\n</think>\n<answer>7</answer>\n").json()
        bad = verify(url, "<answer>7</answer><think>late</think>").json()

    assert good["reward"] == 1.0
    assert bad["reward"] == 0.0


def test_the_code_verifier_runs_the_completions_code_against_the_rows_tests(tmp_path):
    solution = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```"
    tests = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 5"]
    with reward_server(tmp_path, None, [{"builtin": "code"}], sandbox={"cpuSeconds": 2, "memoryMb": 256}) as url:
        partial = verify(url, solution, tests=tests).json()["reward"]
        whole = verify(url, solution, tests="assert add(1, 2) == 3\nassert add(0, 0) == 0").json()["reward"]
        early_exit = verify(url, "import sys\nsys.exit(0)", tests="assert add(1, 2) == 3").json()["reward"]
        network = verify(
            url,
            "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\ndef add(a, b):\n    return a + b",
            tests="assert add(1, 2) == 3",
        ).json()["reward"]

    assert partial == pytest.approx(2 / 3)
    assert whole == 1.0
    assert early_exit == 0.0, "code that exits before the tests run does not pass them"
    assert network == 0.0, "the sandbox has no network"


@pytest.mark.parametrize(
    ("function", "says"),
    [
        (
            "raises",
            "reward function raises raised on the row 'What is 3+4?': KeyError: 'solution' (rewards.py, line 5)",
        ),
        ("too_many", "reward function too_many returned 2 rewards for 1 completions on the row 'What is 3+4?'"),
        ("nan", "reward function nan returned nan for completion 0 on the row 'What is 3+4?': a reward must be finite"),
        ("text", "reward function text returned '0.5' (str) for completion 0 on the row 'What is 3+4?'"),
        ("slow", "reward function slow ran past its time limit (1 s) on the row 'What is 3+4?'"),
        ("nothing", "no reward function applies to the row 'What is 3+4?': each returned None (nothing)"),
        ("crash", "reward function crash took its worker process down on the row 'What is 3+4?' (exit code 3)"),
    ],
)
def test_a_bad_function_fails_the_verification_naming_the_function_the_row_and_the_error(tmp_path, function, says):
    with reward_server(tmp_path, BAD_FUNCTIONS, [{"name": function}], timeoutSeconds=1, workers=1) as url:
        response = verify(url, "7")
        again = verify(url, "7")

    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith(says)
    assert again.json() == response.json(), "the worker is replaced and fails the same way"


def test_async_functions_are_awaited_and_none_leaves_a_function_out_of_the_sum(tmp_path):
    functions = [{"name": "awaited", "weight": 2.0}, {"name": "nothing"}]
    with reward_server(tmp_path, BAD_FUNCTIONS, functions, workers=1) as url:
        result = verify(url, "7").json()

    assert result["reward"] == 0.5
    assert result["reward_components"] == {"awaited": 0.5}
    assert result["reward_functions"] == {"awaited": 0.25, "nothing": None}


def test_a_failing_function_fails_the_rollout_not_reward_zero(tmp_path, generation_server, policy_sampling):
    with reward_server(tmp_path, BAD_FUNCTIONS, [{"name": "raises"}], generation_server.base_url, workers=1) as url:
        rows = [sampled(policy_sampling, make_row("gsm8k", "What is 3+4?"))]
        batch = asyncio.run(collect_rollouts(rows, {"gsm8k": url}, backoff_s=0.01))

    [failure] = batch.failures
    assert failure.attempts == 1, "retrying cannot fix the function"
    assert str(failure.error).endswith(
        "answered 422: reward function raises raised on the row 'What is 3+4?': "
        "KeyError: 'solution' (rewards.py, line 5)"
    )
    assert batch.metrics["rollout/failed"] == 1.0


def test_a_reward_file_that_does_not_import_stops_the_server_before_it_serves(tmp_path):
    file = tmp_path / "broken.py"
    file.write_text("import numpy_that_is_not_installed\n")
    config = {"file": str(file), "functions": [{"name": "accuracy"}]}

    with pytest.raises(RewardFileError, match="does not import: ModuleNotFoundError"):
        RewardsEnvironment(RewardsConfig.model_validate(config)).start()
    server = subprocess.run(
        [sys.executable, "-m", "grpojob_trainer.environments", "rewards", "--policy-base-url", "http://x/v1"],
        env={"GRPOJOB_REWARDS": json.dumps(config), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert server.returncode == 1
    last_line = server.stderr.strip().splitlines()[-1]
    assert last_line == (
        f"environment rewards: reward file {file} does not import: "
        "ModuleNotFoundError: No module named 'numpy_that_is_not_installed' (broken.py, line 1)"
    )


def test_a_function_the_file_does_not_define_is_named_with_those_it_does(tmp_path):
    file = tmp_path / "rewards.py"
    file.write_text(FIVE_LINES)
    config = RewardsConfig.model_validate({"file": str(file), "functions": [{"name": "accuracy"}]})

    with pytest.raises(RewardFileError, match=r"defines no function accuracy \(it defines: short_answer\)"):
        RewardsEnvironment(config).start()
