"""metrics.jsonl, rollouts/step-N.jsonl, trackers, and what the terminal shows while training."""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

import torch

from grpocli.rundir import RunDir, read_jsonl
from grpocli.trainer.rollouts import Rollouts


class MetricsLog:
    """Appends one JSON line per step (main process only), flushed so a crash loses at most one."""

    def __init__(self, run: RunDir, *, resume_step: int) -> None:
        self.path = run.metrics
        run.root.mkdir(parents=True, exist_ok=True)
        kept = [m for m in read_jsonl(self.path) if m.get("step", 0) <= resume_step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(m) + "\n" for m in kept), encoding="utf-8")
        os.replace(tmp, self.path)  # steps after the checkpoint we resume from are redone
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def write(self, metrics: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def write_rollouts(run: RunDir, step: int, rollouts: Rollouts, accelerator: Any) -> None:
    """rollouts/step-N.jsonl: prompt, completion, each reward, total reward, advantage.

    Every process must call it: each one's rows are gathered (accelerate's gather_object, in
    rank order) and the main process writes them all; `group` is the group's index over all processes.
    """
    from accelerate.utils import gather_object

    g = rollouts.group_size
    first = accelerator.process_index * rollouts.num_prompts
    rows = [{
        "step": step,
        "group": first + i // g,
        "prompt": rollouts.rows[i // g]["prompt_text"],
        "completion": completion,
        "rewards": {k: v[i] for k, v in rollouts.per_reward.items()},
        "reward": float(rollouts.rewards[i]),
        "advantage": float(rollouts.advantages[i]),
        "truncated": bool(rollouts.truncated[i]),
        "kept": bool(rollouts.keep[i]),
    } for i, completion in enumerate(rollouts.completions)]
    if accelerator.num_processes > 1:
        rows = gather_object(rows)
    if not accelerator.is_main_process:
        return
    run.rollouts.mkdir(parents=True, exist_ok=True)
    tmp = run.rollout_file(step).with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    os.replace(tmp, run.rollout_file(step))


def length_metrics(rollouts: Rollouts) -> dict[str, float]:
    """TRL's completions/* metrics."""
    lengths = rollouts.completion_lengths()  # [B*G]
    terminated = lengths[~rollouts.truncated]
    return {
        "completions/mean_length": float(lengths.mean()),
        "completions/min_length": float(lengths.min()),
        "completions/max_length": float(lengths.max()),
        "completions/clipped_ratio": float(rollouts.truncated.float().mean()),
        "completions/mean_terminated_length": float(terminated.mean()) if len(terminated) else 0.0,
    }


class Progress:
    """A rich progress bar on a terminal, plain lines otherwise, nothing with 'none'."""

    SHOWN = (("reward", "reward"), ("kl", "kl"), ("completions/mean_length", "len"),
             ("frac_reward_zero_std", "zero_std"), ("tokens_per_second", "tok/s"))

    def __init__(self, mode: str, total: int, enabled: bool) -> None:
        self.mode = "rich" if mode == "auto" and sys.stderr.isatty() else ("plain" if mode == "auto" else mode)
        self.enabled = enabled and self.mode != "none"
        self._bar = None
        if self.enabled and self.mode == "rich":
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeRemainingColumn

            self._bar = Bar(TextColumn("step"), MofNCompleteColumn(), BarColumn(), TimeRemainingColumn(),
                            TextColumn("{task.fields[info]}"), transient=False)
            self._task = self._bar.add_task("train", total=total, info="")
            self._bar.start()

    def resume_at(self, step: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=step)

    def update(self, metrics: dict[str, Any], total: int) -> None:
        if not self.enabled:
            return
        info = "  ".join(f"{name} {metrics[key]:.4g}" for key, name in self.SHOWN
                         if isinstance(metrics.get(key), (int, float)))
        if self._bar is not None:
            self._bar.update(self._task, completed=metrics["step"], info=info)
        else:
            print(f"step {metrics['step']}/{total}  {info}", file=sys.stderr, flush=True)

    def note(self, text: str, *, always: bool = False) -> None:
        """A line above the progress display; `always` prints it even with log.progress='none'."""
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False)
        elif self.enabled or always:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def gather_floats(accelerator: Any, values: torch.Tensor) -> torch.Tensor:
    """Concatenate a 1-D float tensor from every process (same length on each)."""
    return accelerator.gather(values.to(accelerator.device)).cpu()
