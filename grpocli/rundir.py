"""The run directory: a contract between training, eval, inspect and users. No torch here.

    <run>/config.resolved.toml
    <run>/metrics.jsonl              one JSON object per step
    <run>/rollouts/step-N.jsonl      prompt, completion, each reward, advantage
    <run>/checkpoints/step-N/        model + tokenizer (save_pretrained) + trainer/ state
A checkpoint directory is complete exactly when it is named step-N: it is written as
step-N.tmp and renamed at the end (an atomic rename), so a crash never leaves a
complete-looking one behind.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

_STEP = re.compile(r"^step-(\d+)$")


class RunDir:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @property
    def config(self) -> Path:
        return self.root / "config.resolved.toml"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def rollouts(self) -> Path:
        return self.root / "rollouts"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

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

    def read_metrics(self) -> list[dict[str, Any]]:
        """Every complete line of metrics.jsonl (a torn last line, from a crash, is skipped)."""
        return read_jsonl(self.metrics)

    def has_run(self) -> bool:
        return self.metrics.exists() or bool(self.list_checkpoints())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
