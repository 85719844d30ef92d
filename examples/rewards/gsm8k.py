"""Reward functions for GSM8K, as TRL takes them: the built-in math checker scores the answer itself; this file
adds partial credit for answering with a bare number, which a policy learns long before it gets the numbers
right.

Each function gets the prompts, the completions (conversational: a list of messages each) and the row's columns
(`expected_answer` here) as keyword arguments, and returns one reward per completion, or None where it does
not apply.
"""

import re

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def numeric_answer(completions, **kwargs):
    """The share of the final answer's characters that are digits: 1.0 for `<answer>72</answer>`."""
    rewards = []
    for completion in completions:
        text = completion[-1]["content"]
        found = ANSWER.findall(text)
        answer = "".join((found[-1] if found else text).split())
        rewards.append(sum(c.isdigit() for c in answer) / len(answer) if answer else 0.0)
    return rewards
