"""Each reward's scores on the probes (grpocli.evaluation.probes), and what they say about it.

Rewards are called through the trainer's own path (``grpocli.rewards.score``): the prompts as the
dataset holds them, every dataset column by name, ``completion_ids``, ``trainer_state``,
``log_extra`` and ``log_metric``, and completions as chat messages exactly when the prompts
are (TRL's rule). Each reward scores each probe on its own, so one that fails is named with the
probes it fails on and the others are still scored; ``on_error`` ("mask", "none") is set aside here
(a failure on a probe is what this check looks for).

Flags (``EPS`` is the smallest difference that counts), from the mean score of each probe:

    fails                     raised, timed out or returned something else than a score (exit 2)
    constant                  one value (or None) for every probe completion (exit 2): no signal
    returns None              None for some probe completions ("does not apply": scored 0)
    length alone              a wrong answer scores as the right one, and padding the right one
                              (same answer, same format: the "long" probe) changes its score
    format alone              a wrong answer in format scores as the right one, and the format pays
    cannot tell right from wrong   the right answer scores no more than a wrong one, for no reason above
    pays for padding          the right answer padded long or repeated scores more than alone
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from grpocli.errors import UserError
from grpocli.evaluation.probes import Probe
from grpocli.rewards import RewardFn, score

EPS = 1e-6
LENGTH_PROBES = ("empty", "long", "repeated")


@dataclass(frozen=True)
class Flag:
    kind: str
    reason: str
    fatal: bool = False  # makes `grpo check-rewards` exit 2


@dataclass
class RewardReport:
    """One reward on every probe: its values, means (None: no value), failures and flags."""

    name: str
    values: dict[str, list[float | None]] = field(default_factory=dict)  # probe -> [P]
    failures: dict[str, str] = field(default_factory=dict)               # probe -> what went wrong
    hint: str | None = None                                              # the first failure's advice
    flags: list[Flag] = field(default_factory=list)

    def mean(self, probe: str) -> float | None:
        present = [v for v in self.values.get(probe, []) if v is not None]
        return statistics.fmean(present) if present else None

    @property
    def fatal(self) -> bool:
        return any(f.fatal for f in self.flags)


def score_probes(reward_fns: Sequence[RewardFn], rows: list[dict[str, Any]], probes: Sequence[Probe],
                 tokenizer: Any, *, prompt_column: str = "prompt", state: Any = None) -> list[RewardReport]:
    """Every reward's scores on every probe, flagged (``rows`` are rendered dataset rows)."""
    reports = []
    for i, rf in enumerate(reward_fns):
        report = RewardReport(rf.name)
        strict = replace(rf, on_error="raise")
        for probe in probes:
            try:
                report.values[probe.name] = _score_one(strict, rows, probe, tokenizer, prompt_column, state)
            except UserError as exc:
                report.failures[probe.name] = exc.what
                report.hint = report.hint or _renumbered(exc.hint, i)
        report.flags = flags(report, has_gold=any(p.name == "gold" for p in probes))
        reports.append(report)
    return reports


def _renumbered(hint: str | None, i: int) -> str | None:
    """A failure's advice, which names the reward as entry 0 of the one-reward call, with its real index."""
    return None if hint is None else hint.replace("rewards[0]", f"rewards[{i}]").replace("entry 0", f"entry {i}")


def _score_one(rf: RewardFn, rows: list[dict[str, Any]], probe: Probe, tokenizer: Any, prompt_column: str,
               state: Any) -> list[float | None]:
    """One reward's values on one probe, called as the trainer calls it."""
    exclude = (prompt_column, "prompt_text")
    names = [k for k in rows[0] if k not in exclude]
    columns = {k: [rows[r].get(k) for r in probe.rows] for k in names}           # [P] each
    prompts = [rows[r].get(prompt_column, rows[r].get("prompt")) for r in probe.rows]  # [P]
    ids = probe.ids if probe.ids is not None else [
        tokenizer(t, add_special_tokens=False)["input_ids"] for t in probe.texts]  # [P][T]
    scores = score([rf], prompts, list(probe.texts), columns, completion_ids=ids, state=state)
    return scores.per_reward[rf.name]


def flags(report: RewardReport, *, has_gold: bool) -> list[Flag]:
    """What the scores say about the reward (the module docstring's table), most serious first."""
    if report.failures:
        where = ", ".join(report.failures)
        first = next(iter(report.failures.values()))
        return [Flag("fails", f"on probe(s) {where}: {first}", fatal=True)]
    out = []
    values = [v for vs in report.values.values() for v in vs]
    present = [v for v in values if v is not None]
    if not present:
        return [Flag("constant", f"returned None for all {len(values)} probe completions: it never scores",
                     fatal=True)]
    if max(present) - min(present) <= EPS:
        return [Flag("constant", f"returned {present[0]:g} for every probe completion ({len(values)}): "
                     "every group would have zero spread, so it teaches nothing", fatal=True)]
    nones = {p: sum(v is None for v in vs) for p, vs in report.values.items() if any(v is None for v in vs)}
    if nones:
        listed = ", ".join(f"{p} {n}/{len(report.values[p])}" for p, n in nones.items())
        out.append(Flag("returns None", f"for {listed} (None counts as 0 in training)"))
    return out + _contrasts(report, has_gold)


def _contrasts(report: RewardReport, has_gold: bool) -> list[Flag]:
    """Flags from the mean scores of probes that differ in one thing."""
    m = report.mean
    base = "gold" if has_gold else "formatted"
    right, wrong, bare = m(base), m("wrong"), m("no format")
    lengths = {p: m(p) for p in LENGTH_PROBES if m(p) is not None}
    out = []
    blind = has_gold and right is not None and wrong is not None and right <= wrong + EPS
    format_pays = right is not None and bare is not None and abs(right - bare) > EPS
    long = lengths.get("long")
    length_moves = right is not None and long is not None and abs(long - right) > EPS  # same answer and format
    if blind and length_moves:
        out.append(Flag("length alone", f"the right answer scores {right:.3g}, a wrong one {wrong:.3g}, while "
                        + _listed(lengths) + ": it pays for length, not the answer"))
    elif blind and format_pays:
        out.append(Flag("format alone", f"a wrong answer in format scores {wrong:.3g}, the right one {right:.3g}, "
                        f"the right one without the format {bare:.3g}: it pays for the format, not the answer"))
    elif blind:
        out.append(Flag("cannot tell right from wrong",
                        f"the right answer scores {right:.3g}, a wrong one in the same format {wrong:.3g}"))
    padded = {p: v for p, v in lengths.items() if p in ("long", "repeated") and right is not None and v > right + EPS}
    if padded and not blind:
        out.append(Flag("pays for padding", f"the right answer scores {right:.3g} alone, {_listed(padded)}"))
    return out


def _listed(means: dict[str, float]) -> str:
    return ", ".join(f"{p} {v:.3g}" for p, v in means.items())
