"""The rich table of `grpo eval`: one row per metric, one column per model (and the change)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

LEADING = ("reward", "reward_std")
TRAILING = ("answer_rate", "completions/mean_length", "completions/clipped_ratio", "num_prompts")
CAPTION = ("pass@k: unbiased estimator (Chen et al. 2021); mean@N: share of samples that succeed; "
           "maj@N: the most frequent answer succeeds; answer_rate: share of samples with an answer; "
           "clipped_ratio: share cut at max_completion_length")


def metric_order(names: list[str]) -> list[str]:
    """reward, per-reward means, pass@k (by k), mean@N, maj@N, then lengths."""
    def kind(name: str) -> tuple[int, int, str]:
        if name in LEADING:
            return (0, LEADING.index(name), name)
        if name.startswith("rewards/"):
            return (1, 0, name)
        for rank, prefix in enumerate(("pass@", "mean@", "maj@"), start=2):
            if name.startswith(prefix) and name[len(prefix):].isdigit():
                return (rank, int(name[len(prefix):]), name)
        if name in TRAILING:
            return (6, TRAILING.index(name), name)
        return (5, 0, name)

    return sorted(names, key=kind)


def comparison_table(results: dict[str, dict[str, Any]], *, title: str) -> Table:
    """``results``: {model label: metrics}. With two models a third column shows the change."""
    labels = list(results)
    table = Table(title=title, caption=CAPTION)
    table.add_column("metric", style="bold", no_wrap=True)
    for label in labels:
        table.add_column(label, justify="right")
    if len(labels) == 2:
        table.add_column(f"{labels[1]} - {labels[0]}", justify="right")
    names = metric_order(sorted({k for m in results.values() for k in m}))
    for name in names:
        values = [results[label].get(name) for label in labels]
        cells = [_fmt(v) for v in values]
        if len(labels) == 2:
            cells.append(_delta(*values))
        table.add_row(name, *cells)
    return table


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"
    return str(value)


def _delta(a: Any, b: Any) -> str:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return "-"
    return f"{b - a:+.4g}"
