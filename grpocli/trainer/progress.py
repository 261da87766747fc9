"""What the terminal shows while training: a rich progress bar, plain lines, or nothing."""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    """A rich progress bar on a terminal, plain lines otherwise, nothing with 'none'."""

    SHOWN = (("reward", "reward"), ("kl", "kl"), ("completions/mean_length", "len"),
             ("frac_reward_zero_std", "zero_std"), ("tokens_per_second", "tok/s"))

    def __init__(self, mode: str, total: int, enabled: bool) -> None:
        self.mode = "rich" if mode == "auto" and sys.stderr.isatty() else ("plain" if mode == "auto" else mode)
        self.enabled = enabled and self.mode != "none"
        self._bar = None
        if self.enabled and self.mode == "rich":
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bar

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
