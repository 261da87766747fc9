"""Rewards: the TRL reward contract, the built-in rewards and the runner that scores a batch.

Light imports only (no torch): ``grpo --help`` and ``grpo inspect plugins`` import this.
"""

from grpocli.rewards.scoring import (
    COMBINATIONS,
    RewardFn,
    Scores,
    resolve,
    reward_metrics,
    score,
)
from grpocli.rewards.text import completion_text

__all__ = ["COMBINATIONS", "RewardFn", "Scores", "completion_text", "resolve", "reward_metrics", "score"]
