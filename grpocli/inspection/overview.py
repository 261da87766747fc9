"""`grpo inspect RUN_DIR`: an overview of one run directory. Never imports torch.

What it shows: a summary (model, dataset, rewards, steps, checkpoints, rollouts), notes, the
saved evaluations, a table of the key metrics with sparklines, the alerts (grpocli.inspection.alerts)
and a metrics.png (grpocli.inspection.plot); with ``--rollouts STEP``, that step's best and worst
rollouts instead (a multi-turn rollout as its conversation, grpocli.inspection.conversation).

Reads the run directory (grpocli.rundir) as far as it goes: a torn last line of metrics.jsonl
(a crash, or a run still writing) is left out with a note, and a run that stopped or may still
be going gets a note saying so. Lines that share a step (an eval line after a training line) are
merged into one.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from grpocli.errors import UserError
from grpocli.inspection import plot
from grpocli.inspection.alerts import RULES, scan
from grpocli.inspection.conversation import conversation_text
from grpocli.rundir import RunDir, checkpoint_problems, read_jsonl_lines

SPARKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 16
RUNNING_SECONDS = 120  # metrics.jsonl written this recently: the run may still be going
KEY_METRICS = (
    "reward", "reward_std", "rewards/*/mean", "eval/reward", "eval/pass@*", "eval/mean@*", "eval/maj@*",
    "kl", "entropy", "completions/mean_length", "completions/clipped_ratio", "frac_reward_zero_std",
    "loss", "grad_norm", "learning_rate", "tokens_per_second", "time/generation", "time/training",
)
TOPICS = ("recipes", "recipe", "fields", "plugins", "data")  # the other things `grpo inspect` takes


@dataclass
class MetricsFile:
    """metrics.jsonl as far as it could be read."""

    history: list[dict[str, Any]] = field(default_factory=list)  # one dict per step, by step
    torn: bool = False         # the last line is incomplete
    last_line: int = 0         # its number
    bad_lines: list[int] = field(default_factory=list)  # line numbers (1-based) that are not JSON


def read_metrics(path: Path) -> MetricsFile:
    """Every complete line, merged by step; a torn last line or a bad line (not JSON, not UTF-8)
    is noted, not fatal."""
    out = MetricsFile()
    found = read_jsonl_lines(path)
    by_step: dict[Any, dict[str, Any]] = {}
    for number, row in enumerate(found.rows, start=1):
        by_step.setdefault(row.get("step", f"row {number}"), {}).update(row)
    out.torn, out.last_line = found.torn, (found.skipped[-1] if found.torn else 0)
    out.bad_lines = found.skipped[:-1] if found.torn else list(found.skipped)
    out.history = sorted(by_step.values(), key=lambda m: m.get("step") if isinstance(m.get("step"), int) else 0)
    return out


def sparkline(values: Sequence[float | None], width: int = SPARK_WIDTH, *,
              low: float | None = None, high: float | None = None) -> str:
    """Unicode block sparkline of the finite values, averaged into at most ``width`` buckets,
    scaled between their own extremes or between ``low`` and ``high`` (a scale shared by the
    runs `grpo compare` sets side by side)."""
    finite = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not finite:
        return ""
    buckets = min(width, len(finite))
    means = []
    for b in range(buckets):
        part = finite[b * len(finite) // buckets:(b + 1) * len(finite) // buckets]
        means.append(sum(part) / len(part))
    low = min(means) if low is None else low
    high = max(means) if high is None else high
    if high - low <= 1e-12 * max(1.0, abs(high)):
        return SPARKS[3] * buckets
    return "".join(SPARKS[min(len(SPARKS) - 1, int((v - low) / (high - low) * len(SPARKS)))] for v in means)


def show_run(path: str, rollouts_step: int | None = None, *, n: int = 3, write_png: bool = True,
             console: Console | None = None) -> None:
    """Print the run's summary, notes, evaluations, metrics table and alerts, and write metrics.png
    (unless ``write_png`` is false); with ``rollouts_step``, print that step's rollouts instead."""
    console = console or Console(highlight=False, soft_wrap=True)
    run = open_run(path)
    if rollouts_step is not None:
        show_rollouts(run, rollouts_step, n=n, console=console)
        return
    metrics = read_metrics(run.metrics)
    config = read_config(run)
    console.rule(escape(f"run {run.root}"))
    for line in _summary(run, metrics, config):
        console.print(line)
    for note in run_notes(run, metrics, config):
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    evals = eval_table(run)
    if evals is not None:
        console.print(evals)
    logged = reward_logs(run)
    if metrics.history:
        console.print(metrics_table(metrics.history, spark_width=max(8, min(48, console.width - 66))))
        if logged["metrics"]:  # rewards' log_metric keys
            console.print(metrics_table(metrics.history, spark_width=max(8, min(48, console.width - 66)),
                                        keys=logged["metrics"], title="rewards' log_metric"))
    if logged["columns"]:
        console.print(escape(f"rewards' log_extra columns: {', '.join(logged['columns'])}   "
                             f"(grpo inspect {run.root} --rollouts STEP shows them)"))
    if metrics.history:
        _show_warnings(metrics.history, console)
        if write_png:
            _write_png(run, metrics.history, console)


def metrics_table(history: list[dict[str, Any]], *, spark_width: int = SPARK_WIDTH,
                  keys: Sequence[str] = KEY_METRICS, title: str = "metrics") -> Table:
    """One row per key metric (or per one of ``keys``): first, last, min, max and a sparkline over the steps."""
    first, last = history[0].get("step", 1), history[-1].get("step", len(history))
    table = Table(title=f"{title}, steps {first}..{last}", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("metric", style="bold", no_wrap=True)
    for col in ("first", "last", "min", "max"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("trend", no_wrap=True)
    for key in plot.panel_keys(history, keys):
        _, values = plot.series(history, key)
        if values:
            table.add_row(key, *(fmt_value(v) for v in (values[0], values[-1], min(values), max(values))),
                          sparkline(values, spark_width))
    return table


def reward_logs(run: RunDir) -> dict[str, list[str]]:
    """The names rewards logged through log_metric ("metrics") and log_extra ("columns"), from
    <run>/reward_logs.json (empty lists when the run has none or it cannot be read)."""
    try:
        found = json.loads(run.reward_logs.read_bytes())
    except (OSError, ValueError):
        found = {}
    found = found if isinstance(found, dict) else {}
    return {k: [str(x) for x in found.get(k) or [] if isinstance(x, str)] for k in ("metrics", "columns")}


def eval_results(run: RunDir) -> list[tuple[str, dict[str, Any]]]:
    """(name, metrics) of each `grpo eval` (and in-training) result saved under
    <run>/eval/*/summary.json that can be read, by name."""
    rows = []
    for path in sorted((run.root / "eval").glob("*/summary.json")):
        try:
            summary = json.loads(path.read_bytes())
        except (OSError, ValueError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            continue
        metrics = summary.get("metrics") if isinstance(summary, dict) else None
        rows.append((path.parent.name, metrics if isinstance(metrics, dict) else {}))
    return rows


def eval_keys(rows: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """The metrics an evaluation table shows: reward, pass@k, mean@N, maj@N and the mean length."""
    return [k for k in dict.fromkeys(k for _, m in rows for k in m)
            if k == "reward" or k.startswith(("pass@", "mean@", "maj@")) or k == "completions/mean_length"]


def eval_table(run: RunDir) -> Table | None:
    """The `grpo eval` (and in-training) results saved under <run>/eval/*/summary.json."""
    rows = eval_results(run)
    if not rows:
        return None
    keys = eval_keys(rows)
    table = Table(title=f"evaluations in {run.root / 'eval'}", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("eval", style="bold", no_wrap=True)
    for key in keys:
        table.add_column("length" if key == "completions/mean_length" else key, justify="right", no_wrap=True)
    for name, m in rows:
        table.add_row(Text(name), *(fmt_value(m.get(k)) for k in keys))
    return table


def show_rollouts(run: RunDir, step: int, *, n: int = 3, console: Console) -> None:
    """The n best and n worst completions of a step by total reward, with rewards, advantages and
    the dataset columns of their prompts (the gold answer, ...)."""
    path = run.rollout_file(step)
    if not path.exists():
        available = sorted(rollout_steps(run))
        raise UserError(
            f"no rollouts for step {step} in {run.root}", where="--rollouts",
            valid=f"steps with rollouts: {', '.join(map(str, available))}" if available
            else "none: this run wrote no rollouts (log.rollouts_every = 0, or too few steps yet)",
            hint=f"grpo inspect {run.root} --rollouts {available[-1]}" if available
            else "train with log.rollouts_every=N",
        )
    found = read_jsonl_lines(path)
    rows = found.rows
    if not rows:
        raise UserError(f"{path} holds no complete rollout yet", where="--rollouts",
                        hint="the run may still be writing it; try again")
    if found.skipped:
        console.print(f"[yellow]note:[/yellow] {escape(line_numbers(found.skipped))} of {escape(str(path))} "
                      "cannot be read (not UTF-8 JSON); skipped")
    ranked = sorted(rows, key=lambda r: _num(r.get("reward")), reverse=True)
    kept = sum(bool(r.get("kept", True)) for r in rows)
    console.rule(f"rollouts of step {step}: {len(rows)} completions, {kept} in the loss")
    picks = [("best", ranked[:n])] + ([("worst", ranked[-n:][::-1])] if len(ranked) > n else [])
    for kind, chosen in picks:
        if any("conversation" in r for r in chosen):  # multi-turn: too long for a table's column
            _show_conversations(kind, chosen, console)
            continue
        table = Table(title=f"{kind} {len(chosen)}", show_lines=True)
        table.add_column("reward", justify="right")
        table.add_column("rewards")
        table.add_column("advantage", justify="right")
        table.add_column("prompt (end)", max_width=30)
        columns = any(r.get("columns") for r in chosen)
        if columns:
            table.add_column("columns", max_width=30, overflow="fold")
        extra = any(r.get("extra") for r in chosen)  # rewards' log_extra columns
        if extra:
            table.add_column("log_extra", max_width=30, overflow="fold")
        table.add_column("completion", overflow="fold")
        for r in chosen:
            cells = [fmt_value(r.get("reward")), Text(_reward_parts(r)), fmt_value(r.get("advantage")),
                     Text(tail_text(" ".join(str(r.get("prompt", "")).split()), 80))]
            if columns:
                cells.append(Text(_columns(r.get("columns"))))
            if extra:
                cells.append(Text(_columns(r.get("extra"))))
            table.add_row(*cells, Text(str(r.get("completion", ""))))
        console.print(table)


def _show_conversations(kind: str, chosen: list[dict[str, Any]], console: Console) -> None:
    """Multi-turn rollouts, one block each: a rule with the rewards, the prompt's end and columns,
    then the conversation turn by turn at the console's full width."""
    console.print(Text(f"{kind} {len(chosen)}", style="bold"))
    for k, r in enumerate(chosen, start=1):
        console.rule(Text(f"{kind} {k}: reward {fmt_value(r.get('reward'))}, advantage {fmt_value(r.get('advantage'))}"
                          f"; {_reward_parts(r)}"), align="left")
        console.print(Text("prompt (end): " + tail_text(" ".join(str(r.get("prompt", "")).split()), 80), style="dim"))
        if r.get("columns"):
            console.print(Text(_columns(r.get("columns")), style="dim"))
        console.print(conversation_text(r.get("conversation")))


def _reward_parts(r: dict[str, Any]) -> str:
    """Each reward's value, and whether the rollout was truncated or dropped from the loss."""
    parts = ", ".join(f"{k} {fmt_value(v)}" for k, v in (r.get("rewards") or {}).items())
    return parts + (" (truncated)" if r.get("truncated") else "") + ("" if r.get("kept", True) else " (dropped)")


# -- pieces ---------------------------------------------------------------------------------
def open_run(path: str, *, where: str = "grpo inspect", topics: Sequence[str] = TOPICS) -> RunDir:
    """The run directory at ``path``; a UserError (named after the command ``where``) when there is
    none, or no sign of a run in it; ``topics``: the other words the command takes (did-you-mean)."""
    root = Path(path).expanduser()
    run = RunDir(root)
    if not root.exists():
        from grpocli.errors import did_you_mean

        raise UserError(
            f"no run directory at {path}{did_you_mean(path, topics)}", where=where,
            valid=" | ".join([*topics, "a run directory (with metrics.jsonl)"]),
            hint=f"ls {root.parent}/" + ("   or   grpo inspect recipes" if topics else ""),
        )
    if not (run.has_run() or run.config.exists() or run.rollouts.is_dir()):
        raise UserError(
            f"{path} is not a run directory: it has no metrics.jsonl, config.resolved.toml or checkpoints/",
            where=where, valid="the train.output_dir of a `grpo train` run",
            hint="grpo train quickstart   (writes runs/quickstart)",
        )
    return run


def read_config(run: RunDir) -> dict[str, Any]:
    try:
        return tomllib.loads(run.config.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
        return {}


def _summary(run: RunDir, metrics: MetricsFile, config: dict[str, Any]) -> list[str]:
    model = escape(str(config.get("model", {}).get("name_or_path", "?")))
    data = escape(str(config.get("data", {}).get("dataset", "?")))
    planned = config.get("train", {}).get("steps")
    rewards = escape(", ".join(str(r.get("name", "?")) for r in config.get("rewards", [])) or "?")
    logged = metrics.history[-1].get("step", len(metrics.history)) if metrics.history else 0
    seconds = timed_seconds(metrics.history)
    checkpoints = ", ".join(p.name + (" (damaged)" if checkpoint_problems(p, resume=False) else "")
                            for _, p in run.list_checkpoints()) or "none"
    rollouts = ", ".join(map(str, sorted(rollout_steps(run)))) or "none"
    return [
        f"model [bold]{model}[/bold]  dataset [bold]{data}[/bold]  rewards [bold]{rewards}[/bold]",
        f"steps logged [bold]{logged}[/bold]" + (f" of {planned}" if planned else "")
        + (f"  ({seconds:.0f} s in timed phases)" if seconds else ""),
        escape(f"checkpoints: {checkpoints}"),
        escape(f"rollouts at steps: {rollouts}   (grpo inspect {run.root} --rollouts STEP)"),
    ]


def timed_seconds(history: list[dict[str, Any]]) -> float:
    """Seconds in the timed phases: the top-level time/<phase> keys only, since a key under one
    (time/training/forward_backward) is a part of it and counting it too would count it twice."""
    return sum(v for m in history for k, v in m.items()
               if k.startswith("time/") and k.count("/") == 1 and isinstance(v, (int, float))
               and not isinstance(v, bool) and math.isfinite(v))


def run_notes(run: RunDir, metrics: MetricsFile, config: dict[str, Any]) -> list[str]:
    """What is missing, torn or unfinished in the run: a run still being written says so here."""
    notes = []
    if not run.config.exists():
        notes.append("config.resolved.toml is missing: the recipe of this run is unknown")
    if not metrics.history:
        notes.append("metrics.jsonl is missing or empty: no step has finished yet")
    if metrics.torn:
        notes.append(f"the last line of metrics.jsonl is incomplete (line {metrics.last_line}: the run is "
                     "writing it, or stopped mid-write); it is left out")
    if metrics.bad_lines:
        notes.append(f"{line_numbers(metrics.bad_lines)} of metrics.jsonl cannot be read (not UTF-8 JSON); skipped")
    planned = config.get("train", {}).get("steps")
    logged = metrics.history[-1].get("step", 0) if metrics.history else 0
    if planned and isinstance(logged, int) and logged < planned:
        age = time.time() - run.metrics.stat().st_mtime if run.metrics.exists() else None
        if age is not None and age < RUNNING_SECONDS:
            notes.append(f"the run is at step {logged} of {planned} and wrote metrics {age:.0f} s ago: "
                         "it may still be going; this is what it has written so far")
        else:
            latest = run.newest_intact(resume=True)[0]
            resume = (f"; resume from step-{latest[0]} with `grpo train` and the same train.output_dir"
                      if latest else "")
            notes.append(f"the run stopped at step {logged} of {planned}{resume}")
    idle = [m.get("step") for m in metrics.history if "skipped_update" in m and "entropy" not in m]
    if idle:
        shown = ", ".join(map(str, idle[:5])) + (f", ... ({len(idle)} in all)" if len(idle) > 5 else "")
        notes.append(f"step{'s' if len(idle) > 1 else ''} {shown} "
                     "computed no rows (every group flat, or no loss token): no kl, entropy or clip_ratio is "
                     "logged for them, and the weights did not move")
    for damaged in run.newest_intact(resume=False)[1]:
        notes.append(f"checkpoint {damaged.render()}; resume and `grpo eval` skip it")
    return notes


def _show_warnings(history: list[dict[str, Any]], console: Console) -> None:
    found = scan(history)
    if not found:
        console.print("[green]no warnings[/green] (" + ", ".join(RULES) + ")")
        return
    table = Table(title="warnings", show_lines=True)
    table.add_column("code", style="bold red", no_wrap=True)
    table.add_column("steps", no_wrap=True)
    table.add_column("what and what to do")
    for w in found:
        span = f"{w.step}-{w.last_step}" if w.last_step is not None else f"{w.step}-now"
        table.add_row(w.code, span, Text(w.message))
    console.print(table)


def _write_png(run: RunDir, history: list[dict[str, Any]], console: Console) -> None:
    if not plot.plot_available():
        console.print(f"plot skipped: matplotlib is not installed; {escape(plot.INSTALL_HINT)}")
        return
    target = run.root / "metrics.png"
    try:
        plot.write_plot(history, target, title=str(run.root))
    except OSError as exc:
        console.print(f"[yellow]note:[/yellow] could not write {escape(str(target))}: {escape(str(exc))}")
        return
    console.print(f"plot: {escape(str(target))}")


def rollout_steps(run: RunDir) -> list[int]:
    if not run.rollouts.is_dir():
        return []
    steps = []
    for p in run.rollouts.glob("step-*.jsonl"):
        tail = p.stem.removeprefix("step-")
        if tail.isdigit():
            steps.append(int(tail))
    return steps


def line_numbers(numbers: list[int]) -> str:
    """'line 7' or 'lines 3, 9, ...' (the first five)."""
    shown = ", ".join(map(str, numbers[:5])) + (", ..." if len(numbers) > 5 else "")
    return f"line {shown}" if len(numbers) == 1 else f"lines {shown}"


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else -math.inf


def fmt_value(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return "-" if v is None else str(v)
    if isinstance(v, int) or (v.is_integer() and abs(v) < 1e9):
        return str(int(v))
    return f"{v:.3g}" if abs(v) >= 1e-3 else f"{v:.1e}"


def _columns(columns: Any) -> str:
    """The dataset columns of a rollout (the gold answer, ...), as ``name: value`` lines."""
    if not isinstance(columns, dict):
        return ""
    return "\n".join(f"{k}: {tail_text(' '.join(str(v).split()), 60)}" for k, v in columns.items())


def tail_text(text: str, limit: int) -> str:
    return text if len(text) <= limit else "..." + text[-(limit - 3):]
