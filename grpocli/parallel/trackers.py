"""Experiment trackers (log.report_to), as a TRL user finds them: TRL's key names and its
environment variables, opened through Accelerate.

* Keys: a training step's figures under `train/` and an evaluation's under `eval/`
  (transformers' `rewrite_logs`, which TRL's trackers go through: `train/reward`,
  `train/rewards/reward_len/mean`, `eval/reward`); metrics.jsonl keeps its unprefixed names.
* Project: `WANDB_PROJECT` for wandb, `TRACKIO_PROJECT` for trackio, the recipe's name where
  unset. The trackers read their other variables themselves (WANDB_ENTITY, WANDB_NAME,
  WANDB_MODE, WANDB_DIR, WANDB_TAGS, WANDB_RUN_GROUP, TRACKIO_SPACE_ID, TRACKIO_DIR, ...): grpo
  passes nothing that would override them. TensorBoard writes under the run's folder.
* A tracker named but not installed is refused before any model loads (grpocli.trainer.preflight;
  TRL raises too, where Accelerate alone only warns and drops it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: The variable that names the project, per tracker (the recipe's name where unset).
PROJECT_VARIABLES = {"wandb": "WANDB_PROJECT", "trackio": "TRACKIO_PROJECT"}


def project_name(tracker: str, recipe_name: str) -> str:
    """The project a tracker's run goes to: its standard variable, else the recipe's name."""
    variable = PROJECT_VARIABLES.get(tracker)
    if variable is None:
        return recipe_name
    return os.environ.get(variable, "").strip() or recipe_name


def trackers(report_to: list[str], recipe_name: str, run_dir: Path) -> list[Any]:
    """Accelerate tracker objects for log.report_to, each with its project (given to Accelerator's
    log_with: they start at init_trackers, on the main process)."""
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    out = []
    for name in report_to:
        cls = LOGGER_TYPE_TO_CLASS[name]
        project = project_name(name, recipe_name)
        out.append(cls(project, str(run_dir)) if cls.requires_logging_directory else cls(project))
    return out


def prefixed(metrics: dict[str, Any]) -> dict[str, float]:
    """A metrics.jsonl line as TRL's trackers name it: numbers only, `eval/...` kept, every other key
    under `train/` (the step is the tracker's step, not a value)."""
    return {(k if k.startswith("eval/") else f"train/{k}"): v for k, v in metrics.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


__all__ = ["PROJECT_VARIABLES", "prefixed", "project_name", "trackers"]
