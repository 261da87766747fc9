"""`Rollouts`: one generation batch as every stage reads and extends it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Rollouts:
    """B prompts x G completions, prompt-major (rows [i*G:(i+1)*G] belong to prompt i)."""

    rows: list[dict[str, Any]]          # [B]   dataset rows (all columns)
    prompt_ids: list[list[int]]         # [B][Tp]
    completion_ids: list[list[int]]     # [B*G][Tc]
    completions: list[str]              # [B*G] decoded
    truncated: torch.Tensor             # [B*G] bool: no EOS within max_completion_length
    group_size: int
    engine_logprobs: list[list[float]] | None = None  # [B*G][Tc] from the generation engine
    # multi-turn rollouts (grpocli.tools.turns); None for single-turn ones
    completion_mask: list[list[int]] | None = None    # [B*G][Tc] 1 on the model's tokens, 0 on tool turns
    conversations: list[list[dict[str, Any]]] | None = None  # [B*G] messages after the prompt
    environments: list[Any] | None = None            # [B*G] one environment per rollout
    # filled by scoring
    rewards: torch.Tensor | None = None             # [B*G] total reward
    per_reward: dict[str, list[float | None]] = field(default_factory=dict)
    reward_errors: dict[str, int] = field(default_factory=dict)
    extra: dict[str, list[Any]] = field(default_factory=dict)  # [B*G] each: rewards' log_extra columns
    logged_metrics: dict[str, list[float]] = field(default_factory=dict)  # rewards' log_metric values
    # filled by advantages
    advantages: torch.Tensor | None = None          # [B*G]
    flat: torch.Tensor | None = None                # [B]   bool: the group's rewards have no spread
    keep: torch.Tensor | None = None                # [B*G] bool: its group enters the loss

    @property
    def num_prompts(self) -> int:
        return len(self.rows)

    def prompts(self, column: str) -> list[Any]:
        """The original prompt of each completion ([B*G]), as rewards receive it."""
        return [row[column] for row in self.rows for _ in range(self.group_size)]

    def columns(self, exclude: tuple[str, ...]) -> dict[str, list[Any]]:
        """Every other dataset column, one value per completion ([B*G] each)."""
        names = [k for k in self.rows[0] if k not in exclude] if self.rows else []
        return {k: [row[k] for row in self.rows for _ in range(self.group_size)] for k in names}

    def extra_column(self, name: str) -> list[Any]:
        """A log_extra column, one value per completion (None where a reward logged none)."""
        values = self.extra.get(name, [])
        return [values[i] if i < len(values) else None for i in range(len(self.completion_ids))]

    def completion_lengths(self) -> torch.Tensor:
        return torch.tensor([len(c) for c in self.completion_ids], dtype=torch.float32)  # [B*G]

    def loss_tokens(self, i: int) -> int:
        """Tokens of completion i that can enter the loss: all of them, or the model's own (multi-turn)."""
        return len(self.completion_ids[i]) if self.completion_mask is None else sum(self.completion_mask[i])

    def scored_completions(self) -> list[Any]:
        """What rewards get as ``completions``: the conversations (message lists) of multi-turn
        rollouts, else the decoded texts."""
        return self.conversations if self.conversations is not None else self.completions

    @staticmethod
    def concat(parts: list[Rollouts]) -> Rollouts:
        """Scored Rollouts of the same group size, one after the other."""
        first = parts[0]
        if len(parts) == 1:
            return first
        names = list(first.per_reward)
        return Rollouts(
            rows=[r for p in parts for r in p.rows],
            prompt_ids=[x for p in parts for x in p.prompt_ids],
            completion_ids=[x for p in parts for x in p.completion_ids],
            completions=[x for p in parts for x in p.completions],
            truncated=torch.cat([p.truncated for p in parts]),
            group_size=first.group_size,
            engine_logprobs=[x for p in parts for x in p.engine_logprobs] if first.engine_logprobs else None,
            completion_mask=_joined(parts, "completion_mask"), conversations=_joined(parts, "conversations"),
            environments=_joined(parts, "environments"),
            rewards=torch.cat([p.rewards for p in parts]),
            per_reward={k: [x for p in parts for x in p.per_reward[k]] for k in names},
            reward_errors={k: sum(p.reward_errors.get(k, 0) for p in parts) for k in names
                           if any(p.reward_errors.get(k) for p in parts)},
            extra={k: [x for p in parts for x in p.extra_column(k)] for k in {k for p in parts for k in p.extra}},
            logged_metrics={k: [x for p in parts for x in p.logged_metrics.get(k, [])]
                            for k in {k for p in parts for k in p.logged_metrics}},
        )

    def select_groups(self, groups: list[int]) -> Rollouts:
        """A Rollouts holding only the given prompt groups (in that order)."""
        g = self.group_size
        idx = [i * g + j for i in groups for j in range(g)]
        pick = torch.tensor(idx, dtype=torch.long)
        return Rollouts(
            rows=[self.rows[i] for i in groups],
            prompt_ids=[self.prompt_ids[i] for i in groups],
            completion_ids=[self.completion_ids[i] for i in idx],
            completions=[self.completions[i] for i in idx],
            truncated=self.truncated[pick],
            group_size=g,
            engine_logprobs=[self.engine_logprobs[i] for i in idx] if self.engine_logprobs else None,
            completion_mask=_picked(self.completion_mask, idx), conversations=_picked(self.conversations, idx),
            environments=_picked(self.environments, idx),
            rewards=self.rewards[pick] if self.rewards is not None else None,
            per_reward={k: [v[i] for i in idx] for k, v in self.per_reward.items()},
            reward_errors=dict(self.reward_errors),
            extra={k: [v[i] if i < len(v) else None for i in idx] for k, v in self.extra.items()},
            logged_metrics=self.logged_metrics,
            advantages=self.advantages[pick] if self.advantages is not None else None,
            flat=self.flat[torch.tensor(groups, dtype=torch.long)] if self.flat is not None else None,
            keep=self.keep[pick] if self.keep is not None else None,
        )


def _joined(parts: list[Rollouts], name: str) -> list[Any] | None:
    """A per-completion list field of every part, one after the other (None where the first has none)."""
    if getattr(parts[0], name) is None:
        return None
    return [x for p in parts for x in getattr(p, name)]


def _picked(values: list[Any] | None, idx: list[int]) -> list[Any] | None:
    return [values[i] for i in idx] if values is not None else None
