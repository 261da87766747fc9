"""What a reward receives besides prompts, completions and columns: TRL 1.16's keywords.

TRL's GRPOTrainer calls every reward with ``prompts``, ``completions``, ``completion_ids``,
each dataset column, ``trainer_state`` (a ``transformers.TrainerState``: global_step,
max_steps, epoch, ...), ``log_extra(column, values)`` (extra columns of the completions table)
and ``log_metric(name, value)`` (a scalar averaged into the step's metrics). grpo passes the
same: what rewards log lands in rollouts/step-N.jsonl (``extra``) and metrics.jsonl.
Completions are chat message lists exactly when TRL makes them so: when the prompt is one.
The keywords themselves are the reward contract's: ``grpocli.registry.hookspecs.REWARD_KEYWORDS``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RewardLog:
    """What rewards logged during one scoring call, through TRL's log_extra and log_metric."""

    columns: dict[str, list[Any]] = field(default_factory=dict)   # one value per completion
    metrics: dict[str, list[float]] = field(default_factory=dict)  # scalars, averaged when logged

    def log_extra(self, column: str, values: list[Any]) -> None:
        """TRL's ``log_extra``: a column of the completions table, one value per completion."""
        self.columns.setdefault(str(column), []).extend(list(values))

    def log_metric(self, name: str, value: float) -> None:
        """TRL's ``log_metric``: a scalar for this batch."""
        self.metrics.setdefault(str(name), []).append(float(value))

    def merge(self, other: RewardLog) -> None:
        for column, values in other.columns.items():
            self.columns.setdefault(column, []).extend(values)
        for name, values in other.metrics.items():
            self.metrics.setdefault(name, []).extend(values)

    def metric_means(self) -> dict[str, float]:
        return {name: sum(v) / len(v) for name, v in self.metrics.items() if v}


def is_conversational(prompt: Any) -> bool:
    """TRL's test: a prompt that is a list of chat messages (dicts with a role)."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict) and "role" in prompt[0]


def trl_completions(prompts: list, completions: list) -> list:
    """Completions as TRL hands them to rewards: ``[{"role": "assistant", "content": text}]`` each
    when the prompts are conversational, the strings otherwise (message lists stay as they are)."""
    if not prompts or not is_conversational(prompts[0]):
        return completions
    return [c if isinstance(c, list) else [{"role": "assistant", "content": c}] for c in completions]


def trainer_state(*, global_step: int = 0, max_steps: int = 0, epoch: float = 0.0, num_tokens: int = 0) -> Any:
    """A ``transformers.TrainerState`` as TRL passes it (imported here, not at grpo --help)."""
    from transformers import TrainerState

    return TrainerState(global_step=global_step, max_steps=max_steps, epoch=epoch,
                        num_input_tokens_seen=num_tokens)
