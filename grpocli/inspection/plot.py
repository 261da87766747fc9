"""A PNG of a run's curves for people who would rather look than read. matplotlib is optional.

matplotlib is imported inside ``write_plot`` (the Agg canvas, no pyplot and no display), so
`grpo inspect` works without it: ``plot_available()`` says whether it is installed and
``INSTALL_HINT`` how to get it. No torch here.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

INSTALL_HINT = "pip install 'grpocli[plot]'   (or: pip install matplotlib)"

#: (panel title, [metric keys or key prefixes ending in '*'], y label)
PANELS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("reward", ("reward", "rewards/*/mean", "eval/reward"), "reward"),
    ("KL to reference", ("kl",), "kl"),
    ("completion length", ("completions/mean_length", "completions/max_length"), "tokens"),
    ("entropy", ("entropy",), "nats / token"),
    ("groups without signal", ("frac_reward_zero_std",), "frac_reward_zero_std"),
    ("truncated", ("completions/clipped_ratio",), "clipped_ratio"),
)
FRACTION_PANELS = ("groups without signal", "truncated")  # drawn on a 0..1 axis


def plot_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def series(history: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the finite numbers under ``key``."""
    steps, values = [], []
    for i, m in enumerate(history):
        v = m.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            steps.append(int(m.get("step", i + 1)))
            values.append(float(v))
    return steps, values


def panel_keys(history: Sequence[dict[str, Any]], patterns: Sequence[str]) -> list[str]:
    """Metric keys matching the patterns ('rewards/*/mean' matches every per-reward mean)."""
    present: dict[str, None] = {}
    for m in history:
        present.update(dict.fromkeys(m))
    out = []
    for pattern in patterns:
        if "*" in pattern:
            head, tail = pattern.split("*", 1)
            out += sorted(k for k in present if k.startswith(head) and k.endswith(tail) and k not in out)
        elif pattern in present:
            out.append(pattern)
    return out


def write_plot(history: Sequence[dict[str, Any]], path: Path, *, title: str = "") -> Path:
    """Draw the PANELS as a grid into a PNG at ``path`` (needs matplotlib); return the path."""
    return write_overlay({"": history}, path, title=title)


def write_overlay(histories: dict[str, Sequence[dict[str, Any]]], path: Path, *, title: str = "") -> Path:
    """The PANELS of several runs ({label: history}) overlaid, one colour per run (`grpo compare`);
    with one run (label ""), one colour per metric as `grpo inspect` draws it. Needs matplotlib."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 7.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 3).ravel()
    colours = [f"C{i % 10}" for i in range(len(histories))]
    for ax, (name, patterns, ylabel) in zip(axes, PANELS):
        keys = panel_keys([m for h in histories.values() for m in h], patterns)
        for colour, (label, history) in zip(colours, histories.items()):
            for key in keys:
                steps, values = series(history, key)
                if not steps:
                    continue
                style = _style(key, key == keys[0], len(steps))
                if len(histories) > 1:  # colour says the run; a thin dotted line a secondary key
                    secondary = key != keys[0] and not key.startswith("eval/")  # eval curves stay dashed
                    style.update(color=colour, linestyle=":" if secondary else style["linestyle"])
                ax.plot(steps, values, label=f"{label}: {key}" if label else key, **style)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if name in FRACTION_PANELS:
            ax.set_ylim(-0.03, 1.03)
        if keys:
            ax.legend(fontsize=7, loc="best")
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, alpha=0.5)
    if title:
        fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def _style(key: str, main: bool, points: int) -> dict[str, Any]:
    """Eval curves dashed with markers (few points); the panel's first key drawn thicker."""
    evaluated = key.startswith("eval/")
    return {"marker": "o" if evaluated or points < 3 else None, "linestyle": "--" if evaluated else "-",
            "linewidth": 1.8 if main else 1.0}
