"""A train.guard rollback: back to a checkpoint in the live process, to the same state a resume from it
restores, and nothing already written lost.

    checkpoint_before   the newest intact checkpoint before the first bad step (None: none yet)
    discard_after       what the undone steps wrote, moved to <run>/discarded/rollback-K/: their
                        metrics.jsonl lines, rollouts/step-N.jsonl, eval/step-N-<split>/, checkpoints/step-N/,
                        and rollback.json saying why (read by `grpo train`'s closing lines)
    restore             weights, optimizer, schedule (times the new learning-rate scale), random state,
                        counters and data position from the checkpoint, as Session._start resumes

So after a rollback to step M the run generates from the prompts, weights and random state a resume
from checkpoints/step-M would have (tests/trainer/test_guard_runs.py compares the two), and
metrics.jsonl goes on from step M.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpocli.inspection.alerts import Watch
from grpocli.rundir import RunDir, checkpoint_problems, read_jsonl
from grpocli.trainer.checkpoint import load_checkpoint

if TYPE_CHECKING:
    from grpocli.trainer.session import Session

#: The file in each discarded/rollback-K/ that says what happened (grpocli.inspection.run_summary reads it).
RECORD = "rollback.json"


def checkpoint_before(run: RunDir, step: int) -> tuple[int, Path] | None:
    """The newest checkpoint of a step before ``step`` that a resume could use; None when there is none."""
    for saved, path in reversed(run.list_checkpoints()):
        if saved < step and not checkpoint_problems(path, resume=True):
            return saved, path
    return None


def rollbacks_taken(run: RunDir) -> int:
    """The rollbacks this run directory has taken (its discarded/rollback-K/ folders)."""
    return sum(1 for _ in run.discarded.glob("rollback-*")) if run.discarded.is_dir() else 0


def discard_after(run: RunDir, step: int, number: int, record: dict[str, Any]) -> Path:
    """Move what the steps after ``step`` wrote into discarded/rollback-<number>/ (main process; the
    metrics file must be closed); metrics.jsonl keeps its lines up to ``step``. The folder."""
    folder = run.discarded / f"rollback-{number}"
    folder.mkdir(parents=True, exist_ok=True)
    rows = read_jsonl(run.metrics)
    later = [row for row in rows if _step(row) > step]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in later), encoding="utf-8")
    for path in _written_after(run, step):
        target = folder / path.relative_to(run.root)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
    (folder / RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return folder


def _written_after(run: RunDir, step: int) -> list[Path]:
    """The files and folders of steps after ``step``: rollouts, periodic evaluation samples, checkpoints."""
    found = []
    for folder, pattern in ((run.rollouts, "step-*.jsonl"), (run.root / "eval", "step-*"), (run.checkpoints, "step-*")):
        if folder.is_dir():
            found += [p for p in folder.glob(pattern) if _number(p.name) > step]
    return found


def _number(name: str) -> float:
    """step-12.jsonl, step-12-test, step-12 -> 12 (not a step: -inf, never moved)."""
    digits = name.removeprefix("step-").split("-")[0].split(".")[0]
    return int(digits) if digits.isdigit() else -math.inf


def _step(row: dict[str, Any]) -> float:
    """As MetricsLog keeps lines on resume: no step is 0, an unreadable one is after every checkpoint."""
    step = row.get("step", 0)
    return step if isinstance(step, (int, float)) else math.inf


def restore(s: Session, checkpoint: Path, lr_scale: float) -> None:
    """The checkpoint's state in this process, as a resume from it (Session._start), with the learning rate
    times ``lr_scale`` (every process)."""
    saved = load_checkpoint(checkpoint, parallel=s.parallel, model=s.model, optimizer=s.optimizer,
                            scheduler=s.scheduler, reference=s.reference, lr_scale=lr_scale)
    s.state.load_state_dict(saved)
    s.state.lr_scale = lr_scale  # saved with the checkpoints from here on: a resume keeps it
    s.stream.load_state_dict(saved)
    s.backend.sync_weights(s.policy)
    s.watch = Watch()  # live alerts start again, as in a resumed process
    s.progress.resume_at(s.state.step)


__all__ = ["RECORD", "checkpoint_before", "discard_after", "restore", "rollbacks_taken"]
