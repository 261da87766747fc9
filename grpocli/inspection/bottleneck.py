"""Which phase bounds a run's step, from its metrics (one dict per step, as in metrics.jsonl): the
median share of each phase's seconds (time/generation, time/rewards, time/logprobs, time/training,
time/weight_sync) over the recorded steps, step 1 left out as warm-up where there are more. No torch.

    Bottleneck: generation 71% of a 1.23 s step (median of steps 2-20; step 1 warm-up left out)

What to turn for each phase is grpocli.inspection.remedies; what the plan says of it (fits the device,
KV tokens per sequence) is grpocli.planning.headroom; `grpo inspect RUN` and `grpo bench` print both.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpocli.rundir import RunDir, read_jsonl

#: The phases of a step as metrics.jsonl times them (they add up to step_time), and their names in words.
PHASES = {"generation": "generation", "rewards": "rewards", "logprobs": "log-prob passes",
          "training": "training", "weight_sync": "weight sync"}
#: A phase of at least this share of the step bounds it too (advice for it as well), up to two phases.
ALSO_BOUNDING = 0.3
#: The slowest step's rewards over the median step's: at least this, a few slow calls hold steps up.
SPIKY_REWARDS = 3.0


@dataclass(frozen=True)
class Bottleneck:
    """The phases of the counted steps: medians of their seconds and of their shares of the step."""

    phase: str                          # the largest median share
    seconds: dict[str, float]           # PHASES -> median seconds
    shares: dict[str, float]            # PHASES -> median share of its step
    step_s: float                       # median seconds of a step (step_time)
    first: int                          # the first and last step counted
    last: int
    warmup_left_out: bool               # step 1 was recorded and left out
    reward_seconds: dict[str, float] = field(default_factory=dict)  # rewards/<name>/seconds medians (if logged)
    rewards_peak: float = 0.0           # the slowest counted step's time/rewards
    mean_length: float | None = None    # medians of completions/mean_length and completions/max_length
    max_length: float | None = None

    @property
    def share(self) -> float:
        return self.shares[self.phase]

    def bounding(self) -> tuple[str, ...]:
        """The phases to turn, largest first: the largest, and the next if it takes ALSO_BOUNDING too."""
        ranked = sorted(PHASES, key=lambda p: -self.shares[p])
        return tuple(p for i, p in enumerate(ranked[:2]) if i == 0 or self.shares[p] >= ALSO_BOUNDING)

    def rest_s(self, phase: str) -> float:
        """Seconds of the step outside `phase`."""
        return max(self.step_s - self.seconds[phase], 0.0)

    def headline(self) -> str:
        others = ", ".join(f"{PHASES[p]} {self.shares[p]:.0%}" for p in sorted(PHASES, key=lambda p: -self.shares[p])
                           if p != self.phase)
        where = f"step {self.first}" if self.first == self.last else f"steps {self.first}-{self.last}"
        return (f"{PHASES[self.phase]} {self.share:.0%} of a {self.step_s:.3g} s step (median of {where}"
                + ("; step 1 warm-up left out" if self.warmup_left_out else "") + f"); {others}")

    def as_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "share": self.share, "step_s": self.step_s, "shares": dict(self.shares),
                "seconds": dict(self.seconds), "steps": [self.first, self.last],
                "reward_seconds": dict(self.reward_seconds)}


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _timed(history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows that time their phases (evaluation lines do not)."""
    return [row for row in history if _number(row.get("time/generation")) is not None
            and _number(row.get("time/training")) is not None]


def timed_steps(history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows that time their phases, step 1 left out (warm-up) where there are more."""
    rows = _timed(history)
    return rows[1:] if len(rows) > 1 and rows[0].get("step") == 1 else rows


def _median(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [v for v in (_number(row.get(key)) for row in rows) if v is not None]
    return statistics.median(values) if values else None


def find_bottleneck(history: Sequence[dict[str, Any]]) -> Bottleneck | None:
    """The bounding phase of the run's steps (None: no step records its phase seconds)."""
    rows = timed_steps(history)
    if not rows:
        return None
    seconds = {p: _median(rows, f"time/{p}") or 0.0 for p in PHASES}
    shares: dict[str, list[float]] = {p: [] for p in PHASES}
    steps = []
    for row in rows:
        parts = {p: _number(row.get(f"time/{p}")) or 0.0 for p in PHASES}
        total = _number(row.get("step_time")) or sum(parts.values())
        steps.append(total)
        for p in PHASES:
            shares[p].append(parts[p] / total if total > 0 else 0.0)
    median_shares = {p: statistics.median(v) for p, v in shares.items()}
    names = sorted({key.split("/")[1] for row in rows for key in row
                    if key.startswith("rewards/") and key.endswith("/seconds") and key.count("/") == 2})
    numbered = [s for s in (row.get("step") for row in rows) if isinstance(s, int)]
    return Bottleneck(
        phase=max(PHASES, key=lambda p: median_shares[p]), seconds=seconds, shares=median_shares,
        step_s=statistics.median(steps), first=min(numbered, default=0), last=max(numbered, default=0),
        warmup_left_out=len(rows) < len(_timed(history)),
        reward_seconds={n: _median(rows, f"rewards/{n}/seconds") or 0.0 for n in names},
        rewards_peak=max((_number(row.get("time/rewards")) or 0.0 for row in rows), default=0.0),
        mean_length=_median(rows, "completions/mean_length"), max_length=_median(rows, "completions/max_length"),
    )


def run_bottleneck(path: str | Path) -> Bottleneck | None:
    """The bottleneck of the run directory at `path` (its metrics.jsonl; torn lines skipped)."""
    return find_bottleneck(read_jsonl(RunDir(path).metrics))


__all__ = ["ALSO_BOUNDING", "PHASES", "Bottleneck", "find_bottleneck", "run_bottleneck", "timed_steps"]
