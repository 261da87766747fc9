"""The reward probes of `grpo check-rewards` during training, on the live policy's completions.

Every eval.reward_probes_every steps the main process takes the step's first
eval.reward_probes_rows prompts (as the step trained on them: rendered dataset rows), builds their
probes (grpocli.evaluation.probes: gold, wrong, no format, empty, long, repeated; the format read
once, from the recipe and the first probed row, as `grpo check-rewards` reads it) and scores them
with the recipe's rewards (grpocli.evaluation.probe_scores, the trainer's scoring path, with the
step's ``trainer_state``). The policy's own completions of those prompts are the probe ``sampled``,
with the scores the step gave them (not scored again). What it says, one line each, once per
reward and kind for the whole run:

    length alone, format alone, pays for padding   the probe flags of probe_scores, on these rows
    live pays for length      a padded copy of the right answer (long, repeated) scores more than
                              the answer alone, and the live completions score nearer it than the answer
    live pays for the format  the reward pays for the format whatever the answer (format alone), the live
                              completions score nearer a wrong answer in format than the bare answer, and on
                              a reward that tells right from wrong they score nearer the wrong answer

(the live kinds are said "pays the live completions for length" / "... for the format alone"):

    warning: step 50: reward 'length' pays for length alone: ... (grpo check-rewards RUN/config.resolved.toml probes it)

`LiveProbes.after` returns the step's ``probes/<reward>/flags`` (how many of these each reward raised
there, said before or not); the loop calls it once the step's metrics.jsonl line is written, so they
are not logged (one line per step stays one line per step).
A reward that fails on a probe is set aside there (probe_scores), never stopping the run; anything
else that goes wrong is said once and the probes stay off for the rest of the run. Python's, NumPy's
and torch's CPU random streams are kept as they were, so a run trains the same with or without probes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpocli.evaluation.probe_scores import EPS, RewardReport, score_probes
from grpocli.evaluation.probes import Format, Probe, build_probes, detect_format, format_texts, gold_column, gold_text
from grpocli.rewards.scoring import trainer_state

if TYPE_CHECKING:
    from grpocli.recipe.schema import Recipe
    from grpocli.rewards import RewardFn

LIVE_LENGTH, LIVE_FORMAT = "live pays for length", "live pays for the format"
#: What a reward is found to do (the flags of probe_scores that say it pays for length or the format
#: alone, and what the live completions collect of that pay), and how a warning says it.
SAID = {"length alone": "pays for length alone", "format alone": "pays for the format alone",
        "pays for padding": "pays for padding", LIVE_LENGTH: "pays the live completions for length",
        LIVE_FORMAT: "pays the live completions for the format alone"}
PROBED = ("length alone", "format alone", "pays for padding")  # the flags of probe_scores said here
PADDED = ("long", "repeated")


@dataclass(frozen=True)
class Finding:
    """One thing the probes of a step say about one reward."""

    reward: str
    kind: str    # a key of SAID
    reason: str  # what the scores show

    def line(self, step: int, command: str) -> str:
        return f"warning: step {step}: reward {self.reward!r} {SAID[self.kind]}: {self.reason} ({command} probes it)"


def probe_step(scored: Any, reward_fns: Sequence[RewardFn], recipe: Recipe, tokenizer: Any, *, rows: int,
               step: int, fmt: Format | None = None) -> tuple[Format, list[RewardReport], list[Finding]]:
    """The probes of the first ``rows`` prompts of ``scored`` (a grpocli.trainer.rollouts.Scored: its
    ``rollouts.rows``, ``rollouts.completions``, ``rollouts.completion_ids``, ``rollouts.group_size``,
    ``per_reward``), scored by ``reward_fns``, with the live completions as ``sampled``: the format used
    (``fmt``, else detected), each reward's report and the findings. A reward failing on a probe is set aside."""
    rollouts = scored.rollouts
    picked = list(rollouts.rows[:rows])  # [R]
    fmt = fmt or detect_format(format_texts(recipe, picked), reward_fns)
    gold = gold_column(list(picked[0]), None) if picked else None
    golds = [gold_text(row.get(gold)) for row in picked] if gold else None
    probes = build_probes(golds, len(picked), fmt, lambda t: len(tokenizer(t, add_special_tokens=False)["input_ids"]),
                          recipe.generation.max_completion_length)
    g = rollouts.group_size
    live = len(picked) * g
    sampled = Probe("sampled", [i // g for i in range(live)], list(rollouts.completions[:live]),
                    [list(x) for x in rollouts.completion_ids[:live]])
    state = trainer_state(global_step=max(step - 1, 0), max_steps=recipe.train.steps)  # as the step's rewards saw it
    reports = score_probes(reward_fns, picked, probes, tokenizer, prompt_column=recipe.data.prompt_column, state=state)
    for report in reports:  # the step's own scores of its completions
        report.values[sampled.name] = list(scored.per_reward.get(report.name, [None] * live)[:live])
    return fmt, reports, findings(reports, has_gold=golds is not None)


def findings(reports: Sequence[RewardReport], *, has_gold: bool) -> list[Finding]:
    """The probe flags that say a reward pays for length or the format alone, then what the live
    completions (the probe ``sampled``) collect of that pay (the module docstring's table)."""
    out = [Finding(r.name, f.kind, f.reason) for r in reports for f in r.flags if f.kind in PROBED]
    base = "gold" if has_gold else "formatted"
    judges = [r for r in reports if _tells_right_from_wrong(r)]
    for r in reports:
        live, right = r.mean("sampled"), r.mean(base)
        if live is None or right is None:
            continue
        padded = [(p, v) for p in PADDED if (v := r.mean(p)) is not None and v > right + EPS and live >= (right + v) / 2]
        if padded:
            p, v = max(padded, key=lambda pv: pv[1])
            out.append(Finding(r.name, LIVE_LENGTH, f"they score {live:.3g}, nearer the right answer "
                               f"padded ('{p}' probe, {v:.3g}) than the answer alone ({right:.3g})"))
        wrong, bare = r.mean("wrong"), r.mean("no format")
        if wrong is None or bare is None or not wrong > bare + EPS or wrong + EPS < right or live < (wrong + bare) / 2:
            continue
        missed = [(j.name, j.mean("sampled"), j.mean("wrong"), j.mean(base)) for j in judges if j is not r]
        missed = [(n, s, w, g) for n, s, w, g in missed if s is not None and s <= (w + g) / 2]
        if missed:
            n, s, w, g = missed[0]
            out.append(Finding(r.name, LIVE_FORMAT, f"they score {live:.3g} on it, nearer a wrong "
                               f"answer in format ({wrong:.3g}) than the bare answer ({bare:.3g}), while {n!r} scores "
                               f"them {s:.3g}, nearer a wrong answer ({w:.3g}) than the right one ({g:.3g})"))
    return out


def _tells_right_from_wrong(report: RewardReport) -> bool:
    right, wrong = report.mean("gold"), report.mean("wrong")
    return right is not None and wrong is not None and right > wrong + EPS


@dataclass
class LiveProbes:
    """eval.reward_probes_every in the training loop: `after(step, scored)` once each step is recorded."""

    every: int                    # 0: off (also on the processes other than the main one)
    rows: int
    recipe: Recipe
    reward_fns: list[RewardFn]
    tokenizer: Any
    command: str                  # the `grpo check-rewards ...` that probes the run's recipe
    note: Callable[[str], None]   # prints a line
    fmt: Format | None = None     # read at the first probed step
    said: set[tuple[str, str]] = field(default_factory=set)  # (reward, kind) already warned of

    @classmethod
    def open(cls, recipe: Recipe, reward_fns: list[RewardFn], tokenizer: Any, progress: Any, config: Path, *,
             on: bool = True) -> LiveProbes:
        """``progress``: the run's display (``note(text, always=)``); ``config``: the run's
        config.resolved.toml, which the warnings name; ``on``: False on the processes other than the
        main one, and where no evaluation runs between the steps (`grpo bench`)."""
        return cls(recipe.eval.reward_probes_every if on else 0, recipe.eval.reward_probes_rows, recipe,
                   list(reward_fns), tokenizer, f"grpo check-rewards {_shown(config)}",
                   lambda text: progress.note(text, always=True))

    def after(self, step: int, scored: Any) -> dict[str, float]:
        """When due at ``step``: probe the step's completions (``scored``) and print what was not said
        before; the step's ``probes/<reward>/flags`` (how many kinds each reward raised; {} when not due)."""
        if not self.every or step % self.every or not scored.rollouts.rows:
            return {}
        try:
            with _random_kept():
                self.fmt, reports, found = probe_step(scored, self.reward_fns, self.recipe, self.tokenizer,
                                                      rows=self.rows, step=step, fmt=self.fmt)
        except Exception as exc:  # a check must not stop the training it watches
            self.every = 0
            self.note(f"warning: step {step}: the reward probes (eval.reward_probes_every) failed: "
                      f"{type(exc).__name__}: {exc}; they are off for the rest of the run")
            return {}
        for f in found:
            if (f.reward, f.kind) not in self.said:
                self.said.add((f.reward, f.kind))
                self.note(f.line(step, self.command))
        return {f"probes/{r.name}/flags": float(sum(f.reward == r.name for f in found)) for r in reports}


def _shown(path: Path) -> str:
    """``path`` relative to the working directory where it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


@contextmanager
def _random_kept() -> Iterator[None]:
    """Python's, NumPy's and torch's CPU random state as they were before (a reward may draw from them)."""
    import numpy as np
    import torch

    state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(state)
            np.random.set_state(np_state)
