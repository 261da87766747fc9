"""What one generation cycle hands from phase to phase (grpocli.trainer.loop), each value made
once by its phase and never changed after:

    Rollouts     phase 2, generate     B prompts x G completions, as the backend produced them
    Scored       phase 3, rewards      the rollouts with their rewards
    Advantages   phase 4, advantages   one per completion, and which groups enter the loss

All are prompt-major: completions [i*G : (i+1)*G] belong to prompt i. `select(groups)` cuts any
of them to some groups (the optimizer batches of a cycle); DAPO's fill rounds are joined with
`Scored.concat` and cut to their informative groups (`keep_informative`). Phases 3 and 4
themselves are here too: `score_rollouts`, the rewards of the rollouts (with [[data.sources]], each
source's rows by its own rewards and columns: `source_subsets`, grpocli.rewards.subsets), and
`compute_advantages`, the group-relative advantages over every process's groups.

A sample a reward could not score (`[[rewards]] on_error = "mask"`: `Scored.masked`) is left out
of its group's statistics, gets advantage 0 and is out of the loss (`Advantages.keep` False, as a
row of a dropped group); a group left with fewer than 2 scored samples counts as flat (refilled
by fill_batch, else by grpocli.trainer.refill) and is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from grpocli.algorithms.advantages import overlong_penalty, zero_spread_groups
from grpocli.algorithms.variants import ADVANTAGES
from grpocli.recipe.data_sources import SOURCE_COLUMN, reward_indices
from grpocli.rewards import score
from grpocli.rewards.failures import stop_past_masked_share
from grpocli.rewards.subsets import Subset, score_subsets

if TYPE_CHECKING:
    from grpocli.multiturn.turns import TurnStats
    from grpocli.parallel import Parallel
    from grpocli.recipe import Recipe
    from grpocli.recipe.algorithm_section import AlgorithmSection
    from grpocli.rewards import RewardFn
    from grpocli.trainer.batching import OptimizerBatch
    from grpocli.trainer.step import Frozen


@dataclass(frozen=True)
class Rollouts:
    """B prompts x G completions as generation made them (multi-turn: with their tool turns)."""

    rows: list[dict[str, Any]]          # [B]   dataset rows (all columns, prompt_text too)
    prompt_ids: list[list[int]]         # [B][Tp]
    completion_ids: list[list[int]]     # [B*G][Tc]
    completions: list[str]              # [B*G] decoded
    truncated: torch.Tensor             # [B*G] bool: no EOS within max_completion_length
    group_size: int
    engine_logprobs: list[list[float]] | None = None  # [B*G][Tc] from the generation engine
    # multi-turn rollouts (grpocli.multiturn.turns); None for single-turn ones
    completion_mask: list[list[int]] | None = None    # [B*G][Tc] 1 on the model's tokens, 0 on tool turns
    conversations: list[list[dict[str, Any]]] | None = None  # [B*G] messages after the prompt
    environments: list[Any] | None = None            # [B*G] one environment per rollout

    @property
    def num_prompts(self) -> int:
        return len(self.rows)

    def prompts(self, column: str) -> list[Any]:
        """The prompt of each completion ([B*G]) as rewards receive it: the row's rendered ``prompt``
        (grpocli.data.template.render_row: the column's value, or the messages data.system_prompt makes)."""
        return [row["prompt"] if "prompt_text" in row else row[column] for row in self.rows
                for _ in range(self.group_size)]

    def columns(self, exclude: tuple[str, ...]) -> dict[str, list[Any]]:
        """Every other dataset column, one value per completion ([B*G] each)."""
        names = [k for k in self.rows[0] if k not in exclude] if self.rows else []
        return {k: [row[k] for row in self.rows for _ in range(self.group_size)] for k in names}

    def completion_lengths(self) -> torch.Tensor:
        return torch.tensor([len(c) for c in self.completion_ids], dtype=torch.float32)  # [B*G]

    def loss_tokens(self, i: int) -> int:
        """Tokens of completion i that can enter the loss: all of them, or the model's own (multi-turn)."""
        return len(self.completion_ids[i]) if self.completion_mask is None else sum(self.completion_mask[i])

    def model_lengths(self) -> torch.Tensor:
        """Each completion's tokens written by the model ([B*G]): all of a single-turn one's, a
        multi-turn one's without its tool turns (as TRL counts completion lengths)."""
        return torch.tensor([self.loss_tokens(i) for i in range(len(self.completion_ids))], dtype=torch.float32)

    def scored_completions(self) -> list[Any]:
        """What rewards get as ``completions``: the conversations (message lists) of multi-turn
        rollouts, else the decoded texts."""
        return self.conversations if self.conversations is not None else self.completions

    def select(self, groups: list[int]) -> Rollouts:
        """Only the given prompt groups (in that order)."""
        idx = completions_of(groups, self.group_size)
        return Rollouts(
            rows=[self.rows[i] for i in groups], prompt_ids=[self.prompt_ids[i] for i in groups],
            completion_ids=[self.completion_ids[i] for i in idx], completions=[self.completions[i] for i in idx],
            truncated=self.truncated[torch.tensor(idx, dtype=torch.long)], group_size=self.group_size,
            engine_logprobs=_picked(self.engine_logprobs, idx), completion_mask=_picked(self.completion_mask, idx),
            conversations=_picked(self.conversations, idx), environments=_picked(self.environments, idx),
        )

    @staticmethod
    def concat(parts: list[Rollouts]) -> Rollouts:
        """Rollouts of the same group size, one after the other."""
        first = parts[0]
        return Rollouts(
            rows=[r for p in parts for r in p.rows], prompt_ids=[x for p in parts for x in p.prompt_ids],
            completion_ids=[x for p in parts for x in p.completion_ids],
            completions=[x for p in parts for x in p.completions],
            truncated=torch.cat([p.truncated for p in parts]), group_size=first.group_size,
            engine_logprobs=_joined(parts, "engine_logprobs"), completion_mask=_joined(parts, "completion_mask"),
            conversations=_joined(parts, "conversations"), environments=_joined(parts, "environments"),
        )


@dataclass(frozen=True)
class Scored:
    """Rollouts and what the rewards said of them (grpocli.rewards.score), the total with DAPO's
    overlong penalty."""

    rollouts: Rollouts
    rewards: torch.Tensor                                # [B*G] total reward
    per_reward: dict[str, list[float | None]]            # [B*G] each reward's own values
    errors: dict[str, int] = field(default_factory=dict)  # rows each reward scored None because it raised
    extra: dict[str, list[Any]] = field(default_factory=dict)  # [B*G] each: rewards' log_extra columns
    logged_metrics: dict[str, list[float]] = field(default_factory=dict)  # rewards' log_metric values
    masked_by: dict[str, list[bool]] = field(default_factory=dict)  # [B*G] each: rows the reward could not score
    seconds: dict[str, float] = field(default_factory=dict)  # each reward's batch calls, wall seconds (all rounds)
    row_seconds: dict[str, list[float | None]] = field(default_factory=dict)  # [B*G] each where known (timings)

    @property
    def masked(self) -> torch.Tensor:
        """`bool [B*G]`: the rows some reward could not score (on_error = "mask")."""
        n = len(self.rollouts.completion_ids)
        out = torch.zeros(n, dtype=torch.bool)
        for rows in self.masked_by.values():
            out |= torch.tensor(rows, dtype=torch.bool)
        return out

    def extra_column(self, name: str) -> list[Any]:
        """A log_extra column, one value per completion (None where a reward logged none)."""
        values = self.extra.get(name, [])
        return [values[i] if i < len(values) else None for i in range(len(self.rollouts.completion_ids))]

    def select(self, groups: list[int]) -> Scored:
        """Only the given prompt groups (in that order); the error counts, seconds and logged metrics stay whole."""
        idx = completions_of(groups, self.rollouts.group_size)
        return Scored(
            rollouts=self.rollouts.select(groups), rewards=self.rewards[torch.tensor(idx, dtype=torch.long)],
            per_reward={k: [v[i] for i in idx] for k, v in self.per_reward.items()}, errors=dict(self.errors),
            extra={k: [v[i] if i < len(v) else None for i in idx] for k, v in self.extra.items()},
            logged_metrics=self.logged_metrics, masked_by={k: [v[i] for i in idx] for k, v in self.masked_by.items()},
            seconds=dict(self.seconds), row_seconds={k: [v[i] for i in idx] for k, v in self.row_seconds.items()},
        )

    @staticmethod
    def concat(parts: list[Scored]) -> Scored:
        """Scored rollouts of the same group size and rewards, one after the other."""
        if len(parts) == 1:
            return parts[0]
        names = list(parts[0].per_reward)
        return Scored(
            rollouts=Rollouts.concat([p.rollouts for p in parts]), rewards=torch.cat([p.rewards for p in parts]),
            per_reward={k: [x for p in parts for x in p.per_reward[k]] for k in names},
            errors={k: sum(p.errors.get(k, 0) for p in parts) for k in names if any(p.errors.get(k) for p in parts)},
            extra={k: [x for p in parts for x in p.extra_column(k)] for k in {k for p in parts for k in p.extra}},
            logged_metrics={k: [x for p in parts for x in p.logged_metrics.get(k, [])]
                            for k in {k for p in parts for k in p.logged_metrics}},
            masked_by={k: [x for p in parts for x in p.masked_by.get(k, [False] * len(p.rollouts.completion_ids))]
                       for k in {k for p in parts for k in p.masked_by}},
            seconds={k: sum(p.seconds.get(k, 0.0) for p in parts) for k in {k for p in parts for k in p.seconds}},
            row_seconds={k: [x for p in parts for x in p.row_seconds.get(k, [None] * len(p.rollouts.completion_ids))]
                         for k in {k for p in parts for k in p.row_seconds}},
        )


@dataclass(frozen=True)
class Advantages:
    """The advantage of each completion and which of them enter the loss."""

    values: torch.Tensor  # [B*G]
    flat: torch.Tensor    # [B]   bool: the group's rewards have no spread
    keep: torch.Tensor    # [B*G] bool: its group enters the loss

    def select(self, groups: list[int]) -> Advantages:
        """Only the given prompt groups (in that order)."""
        group_size = len(self.values) // max(len(self.flat), 1)
        idx = torch.tensor(completions_of(groups, group_size), dtype=torch.long)
        return Advantages(self.values[idx], self.flat[torch.tensor(groups, dtype=torch.long)], self.keep[idx])


def flat_groups(scored: Scored) -> torch.Tensor:
    """`bool [B]`: the groups whose (scored) rewards have no spread, or fewer than 2 scored samples."""
    g, masked = scored.rollouts.group_size, scored.masked
    return zero_spread_groups(scored.rewards.view(-1, g), mask=~masked.view(-1, g) if masked.any() else None)


def keep_informative(parts: list[Scored], n: int) -> Scored:
    """The first n groups with reward spread of the fill rounds (flat ones only where too few were found)."""
    merged = Scored.concat(parts)
    flat = flat_groups(merged).tolist()
    order = [i for i, f in enumerate(flat) if not f] + [i for i, f in enumerate(flat) if f]
    return merged.select(sorted(order[:n]))


def completions_of(groups: list[int], group_size: int) -> list[int]:
    """The completion rows of the given prompt groups, in that order."""
    return [i * group_size + j for i in groups for j in range(group_size)]


def _joined(parts: list[Rollouts], name: str) -> list[Any] | None:
    """A per-completion list field of every part, one after the other (None where the first has none)."""
    if getattr(parts[0], name) is None:
        return None
    return [x for p in parts for x in getattr(p, name)]


def _picked(values: list[Any] | None, idx: list[int]) -> list[Any] | None:
    return [values[i] for i in idx] if values is not None else None


# -- phase 3: rewards ----------------------------------------------------------------------
def score_rollouts(rollouts: Rollouts, reward_fns: list[RewardFn], recipe: Recipe, *, state: Any,
                   doing: Callable[[str], None]) -> Scored:
    """The rewards of the rollouts: every reward function called as TRL calls it (`state`: TRL's
    trainer_state keyword; `doing(names)` before each call), the weighted total with DAPO's overlong
    penalty added, each reward's values, errors counted, the rows each could not score (on_error =
    "mask"; UserError past a reward's max_masked_share of them) and its seconds."""
    combination = recipe.algorithm.reward_combination
    if recipe.data.sources:  # each source's rows scored by its own rewards, with its own columns
        scores = score_subsets(reward_fns, len(rollouts.completion_ids), source_subsets(rollouts, reward_fns, recipe),
                               combination, state=state, doing=doing)
    else:
        scores = score(reward_fns, *reward_inputs(rollouts, recipe.data.prompt_column), combination,
                       completion_ids=rollouts.completion_ids, state=state, doing=doing)
    stop_past_masked_share(reward_fns, scores, f"at step {state.global_step + 1}")
    total = torch.tensor(scores.total, dtype=torch.float32)  # [B*G]
    op = recipe.algorithm.overlong_penalty
    if op.buffer_length:
        total += overlong_penalty(rollouts.completion_lengths(), recipe.generation.max_completion_length,
                                  op.buffer_length, op.penalty)
    return Scored(rollouts, total, scores.per_reward, scores.errors, scores.logged.columns, scores.logged.metrics,
                  scores.masked, scores.seconds, scores.row_seconds)


def reward_inputs(rollouts: Rollouts, column: str) -> tuple[list[Any], list[Any], dict[str, list[Any]]]:
    """What the rewards get of the rollouts: ``prompts``, ``completions`` and every other column ([B*G] each;
    not the prompt column, the rendered text or a mixture's source name; TRL's ``environments`` where there are some)."""
    columns = rollouts.columns(exclude=(column, "prompt_text", SOURCE_COLUMN))
    if rollouts.environments is not None:  # TRL's `environments` keyword
        columns["environments"] = rollouts.environments
    return rollouts.prompts(column), rollouts.scored_completions(), columns


def source_subsets(rollouts: Rollouts, reward_fns: list[RewardFn], recipe: Recipe) -> list[Subset]:
    """The rollouts' rows by [[data.sources]] source (their SOURCE_COLUMN), each with the rewards that score
    it (the source's ``rewards``; all for a row of no source) and its prompt column."""
    sources = {source.label: source for source in recipe.data.sources}
    names, labels = [spec.name for spec in recipe.rewards], [rf.name for rf in reward_fns]
    groups: dict[str | None, list[int]] = {}
    for i, row in enumerate(rollouts.rows):
        groups.setdefault(row.get(SOURCE_COLUMN), []).append(i)
    out = []
    for name, idx in groups.items():
        source = sources.get(name) if name is not None else None
        part = rollouts.select(idx)
        column = source.section(recipe.data).prompt_column if source else recipe.data.prompt_column
        fns = reward_indices(source, names, labels) if source else list(range(len(reward_fns)))
        out.append(Subset(completions_of(idx, rollouts.group_size), fns, *reward_inputs(part, column),
                          completion_ids=part.completion_ids))
    return out


# -- phase 4: advantages over every process's groups -------------------------------------
def compute_advantages(parallel: Parallel, scored: Scored, algorithm: AlgorithmSection, *,
                       max_completion_length: int, reward_fns: list[RewardFn], keep_flat: bool = False) -> Advantages:
    """`values [B*G]`, `flat [B]` and `keep [B*G]` of this process's groups.

    An estimator that `needs_components` (GDPO's normalize_then_sum) also gets every reward's own
    values; for it a group is flat only where every one of those has no spread (equal totals
    can hide rewards that differ, which such an estimator still tells apart). Masked samples
    (`Scored.masked`) are out of every statistic, get advantage 0 and stay out of the loss; a
    group with fewer than 2 scored samples is flat and dropped whatever drop_zero_spread_groups says.
    `keep_flat`: flat groups stay whatever drop_zero_spread_groups says (distillation's per-token signal
    does not come from the rewards).
    """
    a, g = algorithm, scored.rollouts.group_size
    entry = ADVANTAGES[a.advantage_scale]
    everyone = parallel.gather(scored.rewards).view(-1, g)                      # [W*B, G]
    masked = parallel.gather(scored.masked.float()).view(-1, g) > 0              # [W*B, G]
    mask = ~masked if masked.any() else None                                     # [W*B, G] scored; None: all
    if entry.needs_components:
        values, weights = reward_components(scored, a, max_completion_length, reward_fns)  # [B*G, R], [R]
        n = values.shape[1]
        parts = parallel.gather(values.reshape(-1)).view(-1, g, n)              # [W*B, G, R]
        adv = entry.fn(everyone, components=parts, weights=weights, mask=mask)  # [W*B, G]
        all_flat = torch.stack([zero_spread_groups(parts[..., k], mask=mask) for k in range(n)]).all(dim=0)  # [W*B]
    else:
        adv = entry.fn(everyone, mask=mask)                                      # [W*B, G]
        all_flat = zero_spread_groups(everyone, mask=mask)                       # [W*B]
    b, rank = scored.rollouts.num_prompts, parallel.rank
    flat = all_flat[rank * b : (rank + 1) * b]                                   # [B]
    keep = ~flat if a.drop_zero_spread_groups and not keep_flat else torch.ones(b, dtype=torch.bool)
    mine = masked[rank * b : (rank + 1) * b]                                     # [B, G]
    if mask is not None:
        keep &= g - mine.sum(dim=1) >= 2                                         # >= 2 scored samples
    return Advantages(values=adv[rank * b : (rank + 1) * b].reshape(-1), flat=flat,  # [B*G], [B]
                      keep=keep.repeat_interleave(g) & ~mine.reshape(-1))            # [B*G]


def reward_components(scored: Scored, algorithm: AlgorithmSection, max_completion_length: int,
                      reward_fns: list[RewardFn]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each reward's own values `[B*G, R]` (None as 0, as in the weighted sum) and weights `[R]`,
    in the order of the recipe's rewards; DAPO's overlong penalty, which the loop adds to the
    total only, as one more reward of weight 1, so the components hold all of the total."""
    columns = [[0.0 if v is None else float(v) for v in scored.per_reward[rf.name]] for rf in reward_fns]
    weights = [float(rf.weight) for rf in reward_fns]
    op = algorithm.overlong_penalty
    if op.buffer_length:
        columns.append(overlong_penalty(scored.rollouts.completion_lengths(), max_completion_length,
                                        op.buffer_length, op.penalty).tolist())
        weights.append(1.0)
    return torch.tensor(columns, dtype=torch.float32).T.contiguous(), torch.tensor(weights)


@dataclass(frozen=True)
class Sampled:
    """Phases 1-3 over one set of prompts (a DAPO fill round is another) and what they took."""

    scored: Scored                # [B*G] the rollouts, with their rewards
    turns: TurnStats | None       # multi-turn: the rollouts' turn and tool-call counts; else None
    generation_s: float           # generating them (0 when generated ahead: the wait is the batch's)
    rewards_s: float              # scoring them


@dataclass(frozen=True)
class Batch:
    """One generation batch (phases 1-4) and what it took."""

    scored: Scored                # [B*G] this process's groups, with their rewards
    advantages: Advantages        # [B*G]
    seconds: dict[str, float]     # time/generation (the wait, when generated ahead), time/rewards
    info: dict[str, float]        # generation/staleness, fill_rounds, rewards' log_metric means, tool counts
    num_tokens: int               # prompt + completion tokens generated, all processes
    completion_tokens: float      # completion tokens generated, all processes


@dataclass(frozen=True)
class Slice:
    """One optimizer batch of the generation batch (phase 5)."""

    scored: Scored                    # [B/S*G] its groups
    advantages: Advantages            # [B/S*G]
    batch: OptimizerBatch             # the micro-batches of the sequences that enter the loss
    frozen: Frozen                    # their old-policy / reference log-probs and engine weights
    mismatch: dict[str, float]        # sampling/* (engine vs trainer log-probs); {} without engine ones
    seconds: float                    # its frozen log-prob passes
    passes: int                       # frozen forward passes this process ran: old policy, in-process reference
