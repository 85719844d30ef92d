"""The hand-off between rollout collection and training: one finished rollout as token ids.

Rollout collection (`grpojob_trainer.nemo_gym`) builds `TrainingSample`s from the `/run` results of
the environment servers, checking that the token ids of successive model calls are contiguous
(NeMo-RL's rule: each call's `prompt_token_ids` starts with every token seen so far). Training
(`grpojob_trainer.algorithm.grpo`, `grpojob_trainer.policy.learner`) only ever sees these samples.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainingSample:
    """One rollout of one dataset row, flattened to a single token sequence.

    ``token_ids``, ``generated_mask`` and ``generation_log_probs`` have the same length. Loss is taken
    only where ``generated_mask`` is true; there ``generation_log_probs`` holds the generation
    engine's log-probability of that token (0.0 elsewhere).
    """

    token_ids: tuple[int, ...]
    generated_mask: tuple[bool, ...]
    generation_log_probs: tuple[float, ...]
    reward: float
    group_index: int
    """Index of the dataset row in the step's batch; rollouts of one row form one GRPO group."""
    truncated: bool = False
    """The last model call stopped at the token limit instead of ending naturally."""
    turns: int = 1
    """Model calls in the rollout."""
    reward_parts: tuple[tuple[str, float], ...] = ()
    """The reward's named parts, for the per-function metrics (``reward/<name>/mean``): each reward function's own
    reward (``reward_functions``: those that apply to the row), else the environment's ``reward_components``."""
    policy_version: int = 0
    """The version of the policy weights that generated it (the driver counts one per trained step, from
    the resumed checkpoint's step). Its staleness when trained is the trained policy's version minus this:
    0 on-policy, at most ``spec.grpo.maxOffPolicySteps``."""

    def __post_init__(self) -> None:
        lengths = {len(self.token_ids), len(self.generated_mask), len(self.generation_log_probs)}
        if len(lengths) != 1:
            raise ValueError(
                "token_ids, generated_mask and generation_log_probs must have equal lengths, got "
                f"{len(self.token_ids)}, {len(self.generated_mask)}, {len(self.generation_log_probs)}"
            )
        if not any(self.generated_mask):
            raise ValueError("a training sample needs at least one generated token")

    @property
    def generated_tokens(self) -> int:
        return sum(self.generated_mask)
