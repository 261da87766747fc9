"""`grpo compare RUN_A RUN_B [...]`: what differs between run directories. Never imports torch.

Reads each run as `grpo inspect` does (grpocli.inspection.overview) and lines them up:

    config_diff      the keys of config.resolved.toml whose values differ, each value with its
                     source from config.sources.json (default, recipe file, env, argument)
    metric_keys      the key metrics any run logged (overview.KEY_METRICS), for sparklines that
                     share one scale per metric and one step axis
    eval rows        every run's eval/*/summary.json
    rollout_match    the rollouts of one prompt at one step in every run: with the same train.seed
                     and [data] the runs draw the same prompts in the same order, so the group of
                     completions of a prompt can be set side by side

A run still being written is read as far as it goes (a torn last metrics line, no eval yet,
rollouts not yet flushed): each run carries notes saying what is missing, nothing is fatal.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpocli.errors import UserError
from grpocli.inspection import plot
from grpocli.inspection.overview import (
    KEY_METRICS,
    MetricsFile,
    eval_results,
    open_run,
    read_config,
    read_metrics,
    rollout_steps,
    run_notes,
)
from grpocli.recipe import flatten
from grpocli.rundir import RunDir, read_jsonl_lines

NOT_RECORDED = "not recorded (a run from before config.sources.json)"
MISSING = "(absent)"  # a key one run's config has and another's lacks
#: Keys that decide which prompts a run draws at each step (with [data]): equal in every run, a
#: step's prompts are the same, so its rollouts can be set side by side.
SAME_PROMPTS = ("train.seed", "train.prompts_per_step", "generation.num_generations", "data.")


@dataclass
class ComparedRun:
    """One run directory as far as it could be read."""

    label: str
    run: RunDir
    config: dict[str, Any]          # flat: {'train.learning_rate': 0.001, ...}; {} when missing
    sources: dict[str, str]         # {dotted key: source}; {} when config.sources.json is missing
    metrics: MetricsFile
    evals: list[tuple[str, dict[str, Any]]]
    notes: list[str] = field(default_factory=list)

    @property
    def last_step(self) -> int:
        steps = [m["step"] for m in self.metrics.history if isinstance(m.get("step"), int)]
        return max(steps, default=0)

    def source_of(self, key: str) -> str:
        if not self.sources:
            return NOT_RECORDED
        return self.sources.get(key, "default")


@dataclass(frozen=True)
class ConfigDifference:
    """A key whose value differs between the runs: one value and one source per run."""

    key: str
    values: tuple[Any, ...]         # MISSING where a run's config lacks the key
    sources: tuple[str, ...]


@dataclass(frozen=True)
class RolloutMatch:
    """The completions of one prompt at one step, one list per run (in the runs' order)."""

    step: int
    prompt: str
    columns: dict[str, Any]                      # the prompt's dataset columns (the gold answer, ...)
    groups: tuple[list[dict[str, Any]], ...]     # per run: its rollout rows of this prompt


def open_runs(paths: Sequence[str]) -> list[ComparedRun]:
    """Every run, read; UserError (exit 2) for fewer than two, one named twice, or a path that is no run."""
    if len(paths) < 2:
        raise UserError(
            f"grpo compare needs at least two runs, got {len(paths)}", where="grpo compare",
            valid="two or more run directories (each a train.output_dir)",
            hint=f"grpo compare {paths[0] if paths else 'runs/a'} runs/other   (one run: grpo inspect RUN)",
        )
    roots = [Path(p).expanduser().resolve() for p in paths]
    twice = sorted({p for p, r in zip(paths, roots) if roots.count(r) > 1})
    if twice:
        raise UserError(f"the same run is named twice: {', '.join(twice)}", where="grpo compare",
                        valid="different run directories", hint="grpo compare runs/a runs/b")
    runs = [open_run(p, where="grpo compare", topics=()) for p in paths]
    return [_read(run, label) for run, label in zip(runs, labels(paths))]


def labels(paths: Sequence[str]) -> list[str]:
    """Short names for the runs: their directory names, or the paths where two names are equal."""
    names = [Path(p).expanduser().name or str(p) for p in paths]
    return names if len(set(names)) == len(names) else [str(p) for p in paths]


def _read(run: RunDir, label: str) -> ComparedRun:
    raw = read_config(run)
    metrics = read_metrics(run.metrics)
    found = ComparedRun(label=label, run=run, config=flatten(raw) if raw else {}, sources=_sources(run),
                        metrics=metrics, evals=eval_results(run), notes=run_notes(run, metrics, raw))
    if run.config.exists() and not found.sources:
        found.notes.append("config.sources.json is missing: where its config values came from is not recorded")
    if not found.evals:
        found.notes.append("no evaluation results (eval/*/summary.json) yet")
    if not rollout_steps(run):
        found.notes.append("no rollouts written yet (rollouts/step-N.jsonl; log.rollouts_every)")
    return found


def _sources(run: RunDir) -> dict[str, str]:
    try:
        found = json.loads(run.config_sources.read_bytes())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def config_diff(runs: Sequence[ComparedRun]) -> list[ConfigDifference]:
    """The keys whose values are not equal in every run that has a config, in the first run's order."""
    having = [r for r in runs if r.config]
    keys = list(dict.fromkeys(k for r in having for k in r.config))
    out = []
    for key in keys:
        values = tuple(r.config.get(key, MISSING) for r in having)
        if any(v != values[0] for v in values[1:]):
            out.append(ConfigDifference(key, values, tuple(r.source_of(key) for r in having)))
    return out


def metric_keys(runs: Sequence[ComparedRun], patterns: Sequence[str] = KEY_METRICS) -> list[str]:
    """The key metrics (patterns as in overview.KEY_METRICS) that any of the runs logged."""
    return plot.panel_keys([m for r in runs for m in r.metrics.history], patterns)


def same_prompts(runs: Sequence[ComparedRun]) -> list[str]:
    """The keys that decide a step's prompts (SAME_PROMPTS) on which the runs differ; [] when none."""
    differing = [d.key for d in config_diff(runs)]
    return [k for k in differing if any(k == p or (p.endswith(".") and k.startswith(p)) for p in SAME_PROMPTS)]


def shared_rollout_steps(runs: Sequence[ComparedRun]) -> list[int]:
    """The steps every run wrote rollouts for, oldest first."""
    common = set(rollout_steps(runs[0].run))
    for r in runs[1:]:
        common &= set(rollout_steps(r.run))
    return sorted(common)


def rollout_match(runs: Sequence[ComparedRun], step: int | None = None,
                  prompt: int = 1) -> tuple[RolloutMatch | None, str]:
    """The ``prompt``-th prompt (1-based) that every run's rollouts of ``step`` hold (default: the
    newest step they share), and a note; (None, why) when there is nothing to set side by side.
    UserError for a ``step`` or ``prompt`` that is not there."""
    steps = shared_rollout_steps(runs)
    if step is None and not steps:
        return None, "no step has rollouts in every run yet"
    if step is not None and step not in steps:
        raise UserError(f"not every run wrote rollouts for step {step}", where="--step",
                        valid=f"steps with rollouts in every run: {', '.join(map(str, steps)) or 'none yet'}",
                        hint=f"grpo compare ... --step {steps[-1]}" if steps else "train with log.rollouts_every=N")
    step = steps[-1] if step is None else step
    by_run = [_by_prompt(r.run.rollout_file(step)) for r in runs]
    empty = [r.label for r, rows in zip(runs, by_run) if not rows]
    if empty:
        return None, f"the rollouts of step {step} in {', '.join(empty)} hold no complete row yet (still being written?)"
    shared = [p for p in by_run[0] if all(p in other for other in by_run[1:])]
    if not shared:
        return None, f"no prompt of step {step} is in every run's rollouts (they do not draw the same prompts)"
    if prompt > len(shared):
        raise UserError(f"step {step} has {len(shared)} prompt(s) in every run's rollouts, not {prompt}",
                        where="--prompt", valid=f"1..{len(shared)}", hint=f"grpo compare ... --prompt {len(shared)}")
    text = shared[prompt - 1]
    groups = tuple(rows[text] for rows in by_run)
    columns = next((r.get("columns") for r in groups[0] if isinstance(r.get("columns"), dict)), {})
    note = f"step {step}, prompt {prompt} of the {len(shared)} that every run drew at that step"
    return RolloutMatch(step, text, columns, groups), note


def _by_prompt(path: Path) -> dict[str, list[dict[str, Any]]]:
    """{prompt text: its rollout rows} of one rollouts file, in the file's order (torn lines skipped)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for row in read_jsonl_lines(path).rows:
        out.setdefault(str(row.get("prompt", "")), []).append(row)
    return out
