"""The lines `grpo train` ends a finished run with: its steps and time, the reward at its start and end,
where it is, and the command that looks at it. Read from the run directory (metrics.jsonl, checkpoints/),
so the same lines come whether the run trained in this process or in several. No torch here.

    done: 50 steps in 1 min 23 s; reward -0.703 at step 1 -> -0.25 at step 50 (mean of the last 10: -0.31)
    run directory runs/quickstart (metrics.jsonl, rollouts/, checkpoints/step-50)
    next: grpo inspect runs/quickstart   (metrics, alerts, metrics.png; --rollouts 50: that step's completions)
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import Any

from grpocli.rundir import RunDir, read_jsonl

LAST = 10  # steps averaged for the reward at the end (one step's reward is noisy)


def summary_lines(root: Path, seconds: float) -> list[str]:
    """The run's closing lines (``seconds``: how long `grpo train` took)."""
    run = RunDir(root)
    steps = [row for row in read_jsonl(run.metrics) if _number(row.get("reward")) and _number(row.get("step"))]
    shown = _shown_path(run.root)
    took = f"in {duration(seconds)}"
    if not steps:
        return [f"done {took}; no step was recorded in {shown}/metrics.jsonl", f"next: grpo inspect {shown}"]
    first, last = steps[0], steps[-1]
    tail = [row["reward"] for row in steps[-LAST:]]
    done = (f"done: {last['step']} steps {took}; reward {first['reward']:.3g} at step {first['step']} -> "
            f"{last['reward']:.3g} at step {last['step']}")
    if len(tail) > 1:
        done += f" (mean of the last {len(tail)}: {sum(tail) / len(tail):.3g})"
    evaluated = [row for row in read_jsonl(run.metrics) if _number(row.get("eval/reward"))]
    if evaluated:
        done += f"; eval/reward {evaluated[-1]['eval/reward']:.3g} at step {evaluated[-1].get('step')}"
    saved = run.latest_checkpoint()
    kept = ["metrics.jsonl", *(["rollouts/"] if run.rollouts.is_dir() else []),
            *([f"checkpoints/step-{saved[0]}"] if saved else [])]
    rollouts = f"; --rollouts {last['step']}: that step's completions" if run.rollout_file(last["step"]).exists() else ""
    return [done, *_rollbacks(run), f"run directory {shown} ({', '.join(kept)})",
            f"next: grpo inspect {shown}   (metrics, alerts, metrics.png{rollouts})"]


def _rollbacks(run: RunDir) -> list[str]:
    """One line per train.guard rollback: <run>/discarded/rollback-K/rollback.json (grpocli.trainer.rollback)."""
    lines = []
    found = run.discarded.glob("rollback-*/rollback.json") if run.discarded.is_dir() else []
    for path in sorted(found, key=lambda p: (len(p.parent.name), p.parent.name)):  # rollback-2 before -10
        try:
            r = json.loads(path.read_text(encoding="utf-8"))
            lines.append(f"rolled back at step {r['at_step']} to step {r['to_step']}, lr x{r['lr_scale']:g} "
                         f"({r['reason']}); the undone steps are kept in discarded/{path.parent.name}/")
        except (OSError, ValueError, KeyError, TypeError):
            lines.append(f"rolled back ({path} cannot be read)")
    return lines


def duration(seconds: float) -> str:
    """``83.2`` -> ``1 min 23 s``; under a minute in seconds, over an hour in hours and minutes."""
    whole = int(round(seconds))
    if whole < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _shown_path(root: Path) -> str:
    """The run directory as the user can type it: relative to here where it is below here."""
    try:
        shown = str(root.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        shown = str(root)
    return shlex.quote(shown)
