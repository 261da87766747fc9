"""Live completions (log.completions_to_print, TRL's num_completions_to_print): a few of each step's
completions with their rewards, printed as training runs.

On a terminal (log.progress 'rich', or 'auto' on a TTY) they are a rich table above the progress
bar; otherwise plain text lines on stderr; nothing with log.progress = 'none'. The main process
prints the first N completions of its own batch (TRL prints a sample of the gathered ones).
"""

from __future__ import annotations

import sys
from typing import Any

from grpocli.trainer.rollouts import Advantages, Scored

#: Characters of a prompt's end and of a completion shown in plain text.
PROMPT_CHARS, COMPLETION_CHARS = 120, 400


def completion_rows(scored: Scored, advantages: Advantages, n: int) -> list[dict[str, Any]]:
    """The first ``n`` completions: prompt text, completion, each reward, the total and the advantage."""
    rollouts = scored.rollouts
    g = rollouts.group_size
    return [{
        "prompt": str(rollouts.rows[i // g].get("prompt_text", "")),
        "completion": completion,
        "rewards": {name: values[i] for name, values in scored.per_reward.items()},
        "reward": float(scored.rewards[i]),
        "advantage": float(advantages.values[i]),
    } for i, completion in enumerate(rollouts.completions[:n])]


def print_completions(step: int, rows: list[dict[str, Any]], progress: Any) -> None:
    """The rows as a rich table where ``progress`` (grpocli.trainer.metrics.Progress) draws on a terminal,
    as text lines otherwise; nothing when it shows nothing."""
    if not rows or not progress.enabled:
        return
    if progress.console is not None:
        progress.console.print(rich_table(step, rows))
        return
    print(plain_text(step, rows), file=sys.stderr, flush=True)


def rich_table(step: int, rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table
    from rich.text import Text

    names = list(rows[0]["rewards"])
    table = Table(title=f"step {step}: {len(rows)} completions", show_lines=True)
    table.add_column("prompt (end)", max_width=40, overflow="fold")
    table.add_column("completion", overflow="fold")
    for name in names:
        table.add_column(name, justify="right")
    table.add_column("reward", justify="right")
    table.add_column("advantage", justify="right")
    for r in rows:
        table.add_row(Text(_tail(r["prompt"], PROMPT_CHARS)), Text(r["completion"]),
                      *(_num(r["rewards"][name]) for name in names), _num(r["reward"]), _num(r["advantage"]))
    return table


def plain_text(step: int, rows: list[dict[str, Any]]) -> str:
    lines = [f"step {step}: {len(rows)} completions"]
    for i, r in enumerate(rows):
        rewards = "  ".join(f"{name} {_num(v)}" for name, v in r["rewards"].items())
        lines.append(f"  [{i}] reward {_num(r['reward'])}  advantage {_num(r['advantage'])}  {rewards}")
        lines.append(f"      prompt: ...{_tail(r['prompt'], PROMPT_CHARS)!r}")
        lines.append(f"      completion: {r['completion'][:COMPLETION_CHARS]!r}")
    return "\n".join(lines)


def _num(value: Any) -> str:
    return "None" if value is None else f"{float(value):.4g}"


def _tail(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[-limit:]


__all__ = ["completion_rows", "plain_text", "print_completions", "rich_table"]
