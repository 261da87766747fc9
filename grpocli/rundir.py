"""The run directory: a contract between training, eval, inspect and users. No torch here.

    <run>/config.resolved.toml
    <run>/config.sources.json        {dotted key: where its value came from} (default, file, env, argument)
    <run>/metrics.jsonl              one JSON object per step
    <run>/rollouts/step-N.jsonl      prompt, completion, each reward, advantage
    <run>/checkpoints/step-N/        model + tokenizer (save_pretrained) + trainer/ state and recipe.toml
    <run>/history/                   what earlier parts of the run ran with: config-until-step-N.toml
                                     (a resume that changed the recipe), attempt-K/ (a start from step 0
                                     that found metrics but no checkpoint: its metrics, config, rollouts)
    <run>/discarded/rollback-K/      steps a train.guard rollback undid: rollback.json, their metrics,
                                     rollouts, eval samples and checkpoints (grpocli.trainer.rollback)
A checkpoint directory is complete exactly when it is named step-N: it is written as
step-N.tmp and renamed at the end (an atomic rename), so a crash never leaves a
complete-looking one behind. A disk can still damage one later (a truncated or deleted file),
so resume and `grpo eval` check it first (`checkpoint_problems`) and take the newest intact one;
`resume_point` is the one rule for which checkpoint `grpo train` continues from (train.resume).

JSON-lines files are read line by line as bytes: a torn or non-UTF-8 line (what SIGKILL or a
full disk leaves at the end) is skipped and its number reported, never fatal.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpocli.errors import UserError

_STEP = re.compile(r"^step-(\d+)$")
#: What a trainer/ directory holds besides the RNG files (see grpocli.trainer.checkpoint).
TRAINER_FILES = ("optimizer.pt", "scheduler.pt")


@dataclass(frozen=True)
class Damaged:
    """A checkpoint that must not be used, and why."""

    path: Path
    problems: list[str]

    def render(self) -> str:
        return f"{self.path.name}: {'; '.join(self.problems)}"


@dataclass
class JsonLines:
    """A JSON-lines file as far as it could be read."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # 1-based numbers of lines that are not UTF-8 JSON objects
    torn: bool = False  # the last line (no newline after it) is one of them: a write cut short


class RunDir:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @property
    def config(self) -> Path:
        return self.root / "config.resolved.toml"

    @property
    def config_sources(self) -> Path:
        return self.root / "config.sources.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def reward_logs(self) -> Path:
        """{"metrics": [...], "columns": [...]}: the names rewards logged through TRL's log_metric (keys of
        metrics.jsonl) and log_extra (the "extra" of rollout rows)."""
        return self.root / "reward_logs.json"

    @property
    def rollouts(self) -> Path:
        return self.root / "rollouts"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def history(self) -> Path:
        return self.root / "history"

    @property
    def discarded(self) -> Path:
        return self.root / "discarded"

    def keep_config(self, step: int, text: str) -> Path:
        """Keep the config steps up to ``step`` ran with (a resume changes config.resolved.toml)."""
        self.history.mkdir(parents=True, exist_ok=True)
        path = self.history / f"config-until-step-{step}.toml"
        path.write_text(text, encoding="utf-8")
        return path

    def set_aside_attempt(self) -> tuple[Path, int] | None:
        """Move what a run that never checkpointed left (metrics, config, rollouts, eval) into
        history/attempt-K/ before a new start from step 0 writes over it; (that folder, its
        number of metrics lines), or None when there was nothing to keep."""
        if not self.metrics.exists() or not (rows := read_jsonl(self.metrics)):
            return None
        number = 1 + sum(1 for p in self.history.glob("attempt-*")) if self.history.is_dir() else 1
        folder = self.history / f"attempt-{number}"
        folder.mkdir(parents=True)
        for path in (self.metrics, self.config, self.config_sources, self.rollouts, self.root / "eval"):
            if path.exists():
                os.replace(path, folder / path.name)
        return folder, len(rows)

    def rollout_file(self, step: int) -> Path:
        return self.rollouts / f"step-{step}.jsonl"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step-{step}"

    def list_checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoints, oldest first."""
        if not self.checkpoints.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.checkpoints.iterdir()
                 if p.is_dir() and (m := _STEP.match(p.name))]
        return sorted(found)

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        found = self.list_checkpoints()
        return found[-1] if found else None

    def newest_intact(self, *, resume: bool) -> tuple[tuple[int, Path] | None, list[Damaged]]:
        """The newest checkpoint with nothing wrong (None when none is), and the newer ones that
        are damaged, newest first. ``resume``: its trainer/ state must be complete too."""
        damaged = []
        for step, path in reversed(self.list_checkpoints()):
            problems = checkpoint_problems(path, resume=resume)
            if not problems:
                return (step, path), damaged
            damaged.append(Damaged(path, problems))
        return None, damaged

    def read_metrics(self) -> list[dict[str, Any]]:
        """Every complete line of metrics.jsonl (a torn last line, from a crash, is skipped)."""
        return read_jsonl(self.metrics)

    def has_run(self) -> bool:
        return self.metrics.exists() or bool(self.list_checkpoints())

    def check_writable(self, where: str = "train.output_dir") -> None:
        """UserError unless the run directory is (or can be made) a directory this process can
        write in: a path that is a file, or a read-only place, fails here rather than mid-run."""
        existing = self.root
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            what = "is a file" if existing == self.root else f"is inside {existing}, which is a file"
            raise UserError(f"{self.root} {what}, not a directory", where=where,
                            valid="a new directory or an existing run directory",
                            hint=f"pick another: {where}=runs/NAME, or move {existing} away")
        try:
            with tempfile.TemporaryFile(dir=existing, prefix=".grpo-write-check-"):
                pass
        except OSError as err:
            made = "" if existing == self.root else f"cannot create the run directory {self.root}: "
            raise UserError(f"{made}cannot write in {existing}: {err.strerror or err}", where=where,
                            valid="a directory this user can write in (not a read-only mount)",
                            hint=f"pick another: {where}=runs/NAME   or check: ls -ld {existing}") from None


def checkpoint_problems(path: Path, *, resume: bool) -> list[str]:
    """What is wrong with the checkpoint directory ``path``; [] when it is intact.

    The model (config.json + readable safetensors, or a peft adapter) always; the trainer/
    state (state.json, optimizer, scheduler, RNG) only for ``resume``: `grpo eval` and
    `grpo export` read the model alone.
    Only headers are read: a safetensors header (safe_open) and a zip's directory (torch.save).
    """
    if not path.is_dir():
        return ["the directory is gone (removed after it was listed: pruned by train.save_total_limit?)"]
    problems = _model_problems(path)
    if resume:
        problems += _trainer_problems(path / "trainer")
    return problems


def _model_problems(path: Path) -> list[str]:
    if (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
        return _json_problems(path, "adapter_config.json") + _safetensors_problems(path, ["adapter_model.safetensors"])
    problems = _json_problems(path, "config.json")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_bytes())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            return [*problems, f"{index.name} cannot be read ({_first_line(err)})"]
    else:
        shards = sorted(p.name for p in path.glob("*.safetensors"))
        if not shards and (path / "pytorch_model.bin").is_file():
            return problems + _zip_problems(path, ["pytorch_model.bin"])
    return problems + _safetensors_problems(path, shards or ["model.safetensors"])


def _trainer_problems(trainer: Path) -> list[str]:
    if not trainer.is_dir():
        return ["trainer/ is missing (optimizer, scheduler, RNG and state.json)"]
    problems = [f"trainer/{p}" for p in _json_problems(trainer, "state.json")]
    if not problems:
        state = json.loads((trainer / "state.json").read_bytes())
        if not isinstance(state, dict) or not isinstance(state.get("step"), int):
            problems.append("trainer/state.json holds no step")
    if not (trainer / "rng-rank0.pt").is_file():
        problems.append("trainer/rng-rank0.pt is missing: resuming would not repeat the run's random draws")
    rng = sorted(p.name for p in trainer.glob("rng-rank*.pt"))
    problems += [f"trainer/{p}" for p in _zip_problems(trainer, [*TRAINER_FILES, *rng])]
    if (trainer / "reference.safetensors").exists():
        problems += [f"trainer/{p}" for p in _safetensors_problems(trainer, ["reference.safetensors"])]
    return problems


def _json_problems(folder: Path, name: str) -> list[str]:
    file = folder / name
    if not file.is_file():
        return [f"{name} is missing"]
    try:
        json.loads(file.read_bytes())
    except (OSError, ValueError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return [f"{name} cannot be read ({_first_line(err)})"]
    return []


def _safetensors_problems(folder: Path, names: list[str]) -> list[str]:
    from safetensors import safe_open

    problems = []
    for name in names:
        file = folder / name
        if not file.is_file():
            problems.append(f"{name} is missing")
            continue
        try:
            with safe_open(str(file), framework="numpy") as handle:
                handle.keys()
        except Exception as err:  # noqa: BLE001 - SafetensorError is not importable by name everywhere
            problems.append(f"{name} is damaged ({file.stat().st_size} bytes; {_first_line(err)})")
    return problems


def _zip_problems(folder: Path, names: list[str]) -> list[str]:
    """torch.save files are zip archives: a truncated one has no central directory at its end."""
    problems = []
    for name in names:
        file = folder / name
        if not file.is_file():
            problems.append(f"{name} is missing")
        elif not zipfile.is_zipfile(file):
            problems.append(f"{name} is damaged ({file.stat().st_size} bytes: not a complete torch.save file)")
    return problems


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every JSON object of a JSON-lines file that could be read (see `read_jsonl_lines`)."""
    return read_jsonl_lines(path).rows


def read_jsonl_lines(path: Path) -> JsonLines:
    """The file's JSON objects, and the numbers of the lines skipped: not UTF-8, not JSON, or
    not an object (a torn write at the end, or bytes a crash or a full disk left)."""
    out = JsonLines()
    if not path.exists():
        return out
    lines = path.read_bytes().split(b"\n")
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError, JSONDecodeError
            row = None
        if isinstance(row, dict):
            out.rows.append(row)
            continue
        out.skipped.append(number)
        out.torn = out.torn or number == len(lines)
    return out


# -- which checkpoint a run continues from ----------------------------------------------
def resume_point(run: RunDir, resume: str, steps: int) -> tuple[int, Path] | None:
    """The checkpoint `train.resume` names (step, path), None to start afresh; UserError for an
    output_dir that cannot be written, a directory that already holds a run it may not continue,
    a complete one, or a checkpoint that is damaged (auto: the newest intact one, with a warning
    naming each newer damaged one; none intact is an error)."""
    run.check_writable()
    if resume not in ("auto", "never"):
        return _named_checkpoint(run, Path(resume))
    latest, damaged = run.newest_intact(resume=True)
    if run.has_run() and resume == "never":
        raise UserError(
            f"the run directory {run.root} already holds a run", where="train.output_dir",
            valid="an empty or new directory", hint="pick another: train.output_dir=runs/new, or resume: train.resume=auto",
        )
    if damaged and latest is None:
        raise UserError(
            f"no checkpoint in {run.checkpoints} can be resumed from: "
            + "; ".join(d.render() for d in damaged),
            where="train.resume", valid="a checkpoint with its model, tokenizer and trainer/ state complete",
            hint=f"start afresh in a new directory: train.output_dir={run.root}-new   (or move the damaged "
            f"checkpoints away: mv {run.checkpoints} {run.checkpoints}-damaged)",
        )
    for d in damaged:
        _warn(f"skipping the damaged checkpoint {d.path}: {'; '.join(d.problems)}; "
              f"resuming from {latest[1].name} instead")
    if latest is not None and latest[0] >= steps:
        raise UserError(
            f"the run in {run.root} is already complete (checkpoint step-{latest[0]}, train.steps = {steps})",
            where="train.output_dir", valid=f"train.steps > {latest[0]} to train on, or a new output_dir",
            hint=f"grpo inspect {run.root}   or   grpo train ... train.output_dir=runs/new",
        )
    return latest


def _named_checkpoint(run: RunDir, path: Path) -> tuple[int, Path]:
    """train.resume=PATH: that checkpoint, when it is one and intact."""
    intact = ", ".join(str(p) for _, p in run.list_checkpoints()
                       if not checkpoint_problems(p, resume=True)) or "'auto' or 'never'"
    step = path.name.rsplit("-", 1)[-1]
    if not path.is_dir() or not step.isdigit():
        raise UserError(f"no checkpoint at {path}", where="train.resume", valid=intact, hint=f"ls {run.checkpoints}")
    problems = checkpoint_problems(path, resume=True)
    if problems:
        raise UserError(f"the checkpoint {path} is damaged: {'; '.join(problems)}", where="train.resume",
                        valid=intact, hint="train.resume=auto (the newest intact checkpoint), or another PATH")
    return int(step), path


def _warn(text: str) -> None:
    """A warning on stderr, from the first process only."""
    import os
    import sys

    if os.environ.get("RANK", "0") == "0":
        print(f"warning: {text}", file=sys.stderr, flush=True)


def stopped_run(run: RunDir) -> str:
    """What a run stopped by a signal kept (its newest checkpoint, its metrics), after removing the
    checkpoint it was writing (step-N.tmp is never complete); said by `grpo train` as it exits."""
    for partial in run.checkpoints.glob("step-*.tmp") if run.checkpoints.is_dir() else []:
        shutil.rmtree(partial, ignore_errors=True)
    steps = [row.get("step") for row in read_jsonl(run.metrics) if isinstance(row.get("step"), int)]
    metrics = f"metrics.jsonl up to step {max(steps)}" if steps else "no metrics yet"
    latest, _ = run.newest_intact(resume=True)
    if latest is None:
        return (f"no checkpoint yet in {run.root} ({metrics}); the same command starts again from step 0 "
                "(train.save_steps=N writes one every N steps; train.checkpoint_on_signal=true writes one on a signal)")
    redone = f" (steps {latest[0] + 1}-{max(steps)} are trained again)" if steps and max(steps) > latest[0] else ""
    return f"kept {latest[1]} (the newest checkpoint) and {metrics}; the same command resumes from step {latest[0]}{redone}"


# -- failed writes ------------------------------------------------------------------------------
#: What torch's and safetensors' writers say when the OS refuses a write (they drop the errno);
#: torch's stream writer says only "basic_ios::clear" when the last bytes of a file do not fit.
_WRITE_FAILED = ("unexpected pos", "file write failed", "basic_ios::clear", "I/O error", "No space left",
                 "File too large", "Disk quota", "Read-only file system")


def is_write_failure(err: BaseException) -> bool:
    """Whether ``err`` is the OS refusing a write (a full disk, a quota, a size limit, a read-only place)."""
    if isinstance(err, OSError):
        return err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)
    return any(text in str(err) for text in _WRITE_FAILED)


def write_error(err: BaseException) -> str:
    """The first line of a failed write's error, saying what raised it where that is not an OSError."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return first if isinstance(err, OSError) else f"the write failed ({type(err).__name__}: {first})"


def free_space(place: Path, needed: int) -> str:
    """'N MiB free there now', and whether that was room enough (then a limit stopped the write)."""
    existing = place
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        room = shutil.disk_usage(existing).free
    except OSError:
        return "free space unknown"
    free = f"{megabytes(room)} free there now"
    if room > 2 * needed:
        free += " (room enough: a limit stopped the write, e.g. a quota or `ulimit -f`)"
    return free


def megabytes(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"
