"""The models one `grpo eval` compares: the recipe's base model and/or checkpoint directories.

A ``--checkpoint`` is a directory written by save_pretrained (``runs/x/checkpoints/step-200``;
a LoRA run's holds adapter_config.json and the adapters only), or a run directory (its newest
intact checkpoint is taken, with a note naming any newer damaged one). A checkpoint that does
not exist, or is damaged (a truncated or missing file), is an error naming the intact
checkpoints of its run. No torch here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from grpocli.errors import UserError
from grpocli.rundir import RunDir, checkpoint_problems

BASE = "base"
MODEL_FILES = ("config.json", "adapter_config.json")


@dataclass(frozen=True)
class Target:
    label: str              # column title: "base", "step-200", or "run/step-200" when ambiguous
    path: Path | None       # None: the recipe's model.name_or_path
    run_root: Path | None   # the run directory a checkpoint belongs to
    note: str = ""


@contextlib.contextmanager
def while_reading(target: Target, command: str, where: str) -> Iterator[None]:
    """Reading ``target``'s checkpoint: one that is removed meanwhile (a run still training prunes
    old ones: train.save_total_limit) is said to be gone, not a traceback or a hub id to download."""
    if target.path is not None and not target.path.is_dir():
        raise _gone(target, command, where)
    try:
        yield
    except Exception:
        if target.path is None or target.path.is_dir():
            raise
        raise _gone(target, command, where) from None


def _gone(target: Target, command: str, where: str) -> UserError:
    run = RunDir(target.run_root) if target.run_root is not None else None
    now = ", ".join(p.name for _, p in run.list_checkpoints()) if run is not None else ""
    return UserError(
        f"the checkpoint {target.path} was removed while {command} was reading it (a run that is still "
        "training deletes older checkpoints when train.save_total_limit is set)", where=where,
        valid=f"checkpoints of the run now: {now}" if now else "a checkpoint directory that stays in place",
        hint=f"copy it first (cp -r {target.path} /tmp/{target.path.name}) and use the copy, or give the "
        f"run directory{f' ({run.root})' if run is not None else ''} again to take its newest checkpoint",
    )


def resolve_targets(checkpoints: list[str], *, base: bool) -> list[Target]:
    """Base first (when asked or when no checkpoint is given), then each checkpoint in order."""
    targets = [Target(BASE, None, None)] if base or not checkpoints else []
    targets += [resolve_checkpoint(c) for c in checkpoints]
    labels = [t.label for t in targets]
    out = []
    for t in targets:
        if labels.count(t.label) > 1 and t.path is not None:
            parent = t.run_root.name if t.run_root else t.path.parent.name
            t = Target(f"{parent}/{t.label}", t.path, t.run_root, t.note)
        out.append(t)
    seen = [t.label for t in out]
    dupes = sorted({x for x in seen if seen.count(x) > 1})
    if dupes:
        raise UserError(f"the same model is given twice: {', '.join(dupes)}", where="--checkpoint",
                        hint="give each checkpoint once")
    return out


def resolve_checkpoint(value: str, *, where: str = "--checkpoint") -> Target:
    """A checkpoint directory, or a run directory's newest intact checkpoint; ``where`` names
    the argument in errors. A damaged checkpoint (rundir.checkpoint_problems) is an error when
    named, and skipped with a warning in the note when it is a run's newest."""
    path = Path(value).expanduser()
    if path.is_dir() and (any((path / f).exists() for f in MODEL_FILES) or (path / "trainer").is_dir()):
        problems = checkpoint_problems(path, resume=False)
        if problems:
            raise UserError(f"the checkpoint {value} is damaged: {'; '.join(problems)}", where=where,
                            valid=_available(path), hint="evaluate another checkpoint, or the run directory "
                            "(its newest intact checkpoint)")
        run_root = path.parent.parent if path.parent.name == "checkpoints" else None
        return Target(path.name, path, run_root)
    run = RunDir(path)
    if path.is_dir() and run.list_checkpoints():
        return _newest_intact(run, value, where)
    if path.name.endswith(".tmp") or path.with_name(path.name + ".tmp").exists():
        raise UserError(f"the checkpoint {value} is incomplete (still being written, or the run "
                        "stopped while saving it)", where=where,
                        valid=_available(path), hint="use a complete step-N directory")
    if path.is_dir() and run.has_run():
        raise UserError(f"the run {value} has no complete checkpoint yet", where=where,
                        hint=f"wait for train.save_steps, or `grpo inspect {value}`")
    if path.is_dir():
        raise UserError(f"{value} is not a checkpoint: it has no {' or '.join(MODEL_FILES)}",
                        where=where, valid=_available(path),
                        hint="a directory written by save_pretrained, e.g. runs/NAME/checkpoints/step-N")
    raise UserError(f"no checkpoint at {value}", where=where, valid=_available(path),
                    hint=_hint(path))


def _newest_intact(run: RunDir, value: str, where: str) -> Target:
    """The run's newest intact checkpoint, with a note naming it and any newer damaged ones."""
    newest, damaged = run.newest_intact(resume=False)
    if newest is None:
        raise UserError(f"no checkpoint of the run {value} is intact: " + "; ".join(d.render() for d in damaged),
                        where=where, valid="a checkpoint whose model files are complete",
                        hint=f"train on to write a new one (grpo train ... train.output_dir={value}), or "
                        f"`grpo inspect {value}`")
    step, latest = newest
    note = f"{value} is a run directory: taking its newest checkpoint step-{step}"
    if damaged:
        note = (f"{value} is a run directory: taking its newest intact checkpoint step-{step}; warning: skipped "
                "the damaged " + "; ".join(d.render() for d in damaged))
    return Target(latest.name, latest, run.root, note=note)


def _run_of(path: Path) -> RunDir | None:
    """The run directory a (possibly missing) checkpoint path points into."""
    base = path.with_name(path.name.removesuffix(".tmp"))
    if base.parent.name == "checkpoints":
        return RunDir(base.parent.parent)
    if (path / "checkpoints").is_dir():
        return RunDir(path)
    return None


def _available(path: Path) -> str:
    run = _run_of(path)
    found = [p for _, p in (run.list_checkpoints() if run else []) if not checkpoint_problems(p, resume=False)]
    if not found:
        return "a checkpoint directory (runs/NAME/checkpoints/step-N) or a run directory"
    return "intact checkpoints of this run: " + ", ".join(str(p) for p in found)


def _hint(path: Path) -> str:
    run = _run_of(path)
    return f"ls {run.checkpoints}" if run else "ls runs/*/checkpoints"
