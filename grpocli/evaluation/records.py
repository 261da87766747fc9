"""What an evaluation leaves on disk: an eval directory per model and split.

    <eval root>/<label>-<split>/samples.jsonl   one JSON object per completion (prompt, completion,
                                                rewards, reward, success, answer, length, truncated)
    <eval root>/<label>-<split>/summary.json    the metrics and what produced them

The eval root is ``eval.output_dir`` when set, else ``<run>/eval`` of the run a checkpoint
belongs to (``runs/x/checkpoints/step-200`` -> ``runs/x/eval/step-200-test``), else the
recipe's run directory's ``eval/``. Files are written to a temporary name and renamed.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from grpocli.errors import UserError

SAMPLES = "samples.jsonl"
SUMMARY = "summary.json"
UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def eval_dir(root: Path, label: str, split: str) -> Path:
    return Path(root) / f"{UNSAFE.sub('_', label)}-{UNSAFE.sub('_', split)}"


def check_writable(root: Path, where: str) -> None:
    """Create ``root`` and a file in it now, so that a place grpo eval cannot write (read-only, not
    permitted, a file in the way) is named before any model loads or samples, not after sampling."""
    probe = Path(root) / ".grpo-write-probe"
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UserError(
            f"cannot write the evaluation into {root}: {exc.strerror or exc}"
            + (f" ({exc.filename})" if exc.filename and str(exc.filename) != str(probe) else ""),
            where=where, valid="a directory this user can create files in",
            hint="pass --output-dir DIR (or set eval.output_dir) to a writable place, e.g. --output-dir /tmp/eval",
        ) from None


def write_eval(directory: Path, samples: list[dict[str, Any]], summary: dict[str, Any]) -> Path:
    """Write samples.jsonl and summary.json into ``directory``; return it."""
    directory.mkdir(parents=True, exist_ok=True)
    _atomic_write(directory / SAMPLES, "".join(json.dumps(s, default=str) + "\n" for s in samples))
    _atomic_write(directory / SUMMARY, json.dumps(summary, indent=1, default=str) + "\n")
    return directory


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
