"""What `grpo compare RUN_A RUN_B [...]` prints: the runs and their notes, the config keys that
differ (with sources), the key metrics side by side (sparklines on one scale per metric and one
step axis), the evaluations in one table, one prompt's rollouts side by side; and a PNG with the
runs' curves overlaid (grpocli.inspection.plot). The data comes from grpocli.inspection.comparison.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from grpocli.inspection import plot
from grpocli.inspection.comparison import (
    ComparedRun,
    RolloutMatch,
    config_diff,
    metric_keys,
    open_runs,
    rollout_match,
    same_prompts,
)
from grpocli.inspection.overview import eval_keys, fmt_value, sparkline, tail_text

VALUE_WIDTH = 10  # a column of last values or differences (fmt_value: 3 significant digits)


def show_comparison(paths: Sequence[str], *, step: int | None = None, prompt: int = 1, png: Path | None = None,
                    console: Console | None = None) -> None:
    """Print the comparison of the runs at ``paths``; write ``png`` (None: no PNG)."""
    console = console or Console(highlight=False, soft_wrap=True)
    runs = open_runs(paths)
    console.rule(escape("grpo compare " + " vs ".join(r.label for r in runs)))
    for r in runs:
        planned = r.config.get("train.steps")
        console.print(Text(f"{r.label}: {r.run.root}  steps logged {r.last_step}"
                           + (f" of {planned}" if planned else "")))
        for note in r.notes:
            console.print(Text("note: ", style="yellow") + Text(f"{r.label}: {note}"))
    console.print(config_table(runs))
    if any(r.metrics.history for r in runs):
        console.print(metrics_table(runs, width=console.width))
    console.print(evaluations_table(runs) or Text("no run has evaluation results (eval/*/summary.json) yet"))
    _show_rollouts(runs, step, prompt, console)
    if png is not None and any(r.metrics.history for r in runs):
        _write_png(runs, png, console)


def config_table(runs: Sequence[ComparedRun]) -> Table | Text:
    """The config keys that differ: each run's value and, under it, where the value came from."""
    having = [r for r in runs if r.config]
    differences = config_diff(runs)
    if len(having) < 2:
        return Text("config: fewer than two runs have a config.resolved.toml; nothing to compare")
    if not differences:
        return Text("config: every key of config.resolved.toml is equal in " + ", ".join(r.label for r in having))
    table = Table(title=f"config: the {len(differences)} key(s) that differ (value, then its source)",
                  box=box.SIMPLE_HEAD, pad_edge=False, show_lines=True)
    table.add_column("key", style="bold", no_wrap=True)
    for r in having:
        table.add_column(r.label, overflow="fold")
    for d in differences:
        cells = [Text(_value(v)) + Text("\n" + s, style="dim") for v, s in zip(d.values, d.sources)]
        table.add_row(d.key, *cells)
    return table


def metrics_table(runs: Sequence[ComparedRun], *, width: int = 120) -> Table:
    """One row per key metric: each run's last value and its sparkline, every run's drawn on the
    metric's scale over all runs and on one step axis (a run with fewer steps draws a shorter line);
    the sparklines share what of ``width`` (the console's) the other columns leave."""
    last = max(r.last_step for r in runs) or 1
    keys = metric_keys(runs)
    columns = 1 + 2 * len(runs) + (len(runs) == 2)
    fixed = max(map(len, keys), default=6) + VALUE_WIDTH * (len(runs) + (len(runs) == 2)) + 2 * columns
    spark_width = max(8, min(48, (width - fixed) // len(runs)))
    table = Table(title="metrics: last value and trend (one scale per metric, one step axis)",
                  caption=f"difference: {runs[-1].label} minus {runs[0].label}, last values" if len(runs) == 2 else None,
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("metric", style="bold", no_wrap=True)
    for r in runs:
        table.add_column(r.label, justify="right", no_wrap=True)
        table.add_column("trend", no_wrap=True)
    if len(runs) == 2:
        table.add_column("difference", justify="right", no_wrap=True)
    for key in keys:
        curves = [plot.series(r.metrics.history, key) for r in runs]
        every = [v for _, values in curves for v in values]
        cells = []
        for steps, values in curves:
            cells += [fmt_value(values[-1]) if values else "-",
                      step_sparkline(steps, values, last=last, width=spark_width, low=min(every), high=max(every))]
        if len(runs) == 2:
            a, b = (values[-1] if values else None for _, values in curves)
            cells.append("-" if a is None or b is None else f"{b - a:+.3g}")
        table.add_row(key, *cells)
    return table


def step_sparkline(steps: Sequence[int], values: Sequence[float], *, last: int, width: int,
                   low: float, high: float) -> str:
    """A sparkline on the step axis 1..``last`` shared by the runs: character b stands for the steps
    in (b * last / width, (b + 1) * last / width], the mean of their values on the scale low..high
    (overview.sparkline); a blank where the run logged no value (not yet, or an eval every N steps)."""
    width = max(1, min(width, last))
    buckets: list[list[float]] = [[] for _ in range(width)]
    for step, value in zip(steps, values):
        buckets[min(width - 1, max(0, (step - 1) * width // last))].append(value)
    return "".join(sparkline([sum(b) / len(b)], 1, low=low, high=high) if b else " " for b in buckets).rstrip()


def evaluations_table(runs: Sequence[ComparedRun]) -> Table | None:
    """Every run's saved evaluations in one table, the runs' results of one eval next to each other."""
    rows = sorted(((name, i, r.label, m) for i, r in enumerate(runs) for name, m in r.evals),
                  key=lambda row: (row[0], row[1]))
    if not rows:
        return None
    keys = eval_keys([(name, m) for name, _, _, m in rows])
    table = Table(title="evaluations (eval/*/summary.json)", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("eval", style="bold", no_wrap=True)
    table.add_column("run", no_wrap=True)
    for key in keys:
        table.add_column("length" if key == "completions/mean_length" else key, justify="right", no_wrap=True)
    for name, _, label, m in rows:
        table.add_row(Text(name), Text(label), *(fmt_value(m.get(k)) for k in keys))
    return table


def rollouts_table(runs: Sequence[ComparedRun], match: RolloutMatch) -> Table:
    """The completions of one prompt, one column per run, k-th completion against k-th."""
    table = Table(title=f"rollouts of step {match.step}: the same prompt in every run", show_lines=True)
    for r in runs:
        table.add_column(r.label, overflow="fold", ratio=1)
    depth = max(len(g) for g in match.groups)
    for k in range(depth):
        table.add_row(*(_completion(g[k]) if k < len(g) else Text("-") for g in match.groups))
    table.add_row(*(Text(f"mean reward {fmt_value(_mean([row.get('reward') for row in g]))}", style="bold")
                    for g in match.groups))
    return table


def _show_rollouts(runs: Sequence[ComparedRun], step: int | None, prompt: int, console: Console) -> None:
    differing = same_prompts(runs)
    if differing:
        console.print(Text("note: ", style="yellow") + Text(
            f"the runs differ in {', '.join(differing)}: they need not draw the same prompts at a step; "
            "prompts are matched by their text"))
    match, note = rollout_match(runs, step, prompt)
    if match is None:
        console.print(Text("rollouts: ") + Text(note))
        return
    console.print(Text(f"rollouts: {note}"))
    console.print(Text("prompt (end): " + tail_text(" ".join(match.prompt.split()), 100), style="dim"))
    if match.columns:
        console.print(Text("columns: " + ", ".join(f"{k}: {tail_text(str(v), 60)}" for k, v in match.columns.items()),
                           style="dim"))
    console.print(rollouts_table(runs, match))


def _completion(row: dict[str, Any]) -> Text:
    head = f"reward {fmt_value(row.get('reward'))}, advantage {fmt_value(row.get('advantage'))}"
    head += " (truncated)" if row.get("truncated") else ""
    head += "" if row.get("kept", True) else " (dropped)"
    return Text(head + "\n", style="dim") + Text(str(row.get("completion", "")))


def _write_png(runs: Sequence[ComparedRun], target: Path, console: Console) -> None:
    if not plot.plot_available():
        console.print(f"plot skipped: matplotlib is not installed; {escape(plot.INSTALL_HINT)}")
        return
    try:
        plot.write_overlay({r.label: r.metrics.history for r in runs}, target,
                           title=" vs ".join(r.label for r in runs))
    except OSError as exc:
        console.print(Text("note: ", style="yellow") + Text(f"could not write {target}: {exc}"))
        return
    console.print(Text(f"plot: {target}"))


def _value(value: Any) -> str:
    return value if isinstance(value, str) else repr(value) if not isinstance(value, (int, float)) else fmt_value(value)


def _mean(values: list[Any]) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return sum(numbers) / len(numbers) if numbers else None
