"""SIGTERM and SIGINT during `grpo train`: stop cleanly and say what was kept.

A scheduler that preempts a job sends SIGTERM and waits a while before SIGKILL; Ctrl-C sends
SIGINT. Either one raises `Stopped` in the main thread at once: a checkpoint being written is
removed (step-N.tmp is never complete), the run stops, and the command says which checkpoint and
metrics it kept and exits with 128 + the signal (grpocli.cli.app). With
`train.checkpoint_on_signal = true` the first signal instead lets the step that runs finish and
writes its checkpoint before stopping (every process agrees at the step's end); a second signal
stops at once.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Self

from grpocli.errors import Stopped

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """Installs the handlers for the run (main thread only), restores the old ones after it."""

    def __init__(self, *, checkpoint_first: bool) -> None:
        self.checkpoint_first = checkpoint_first
        self.pending: int | None = None  # a signal whose stop waits for the step's end
        self._old: dict[int, object] = {}

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.checkpoint_first and self.pending is None:
            self.pending = signum  # finish this step, checkpoint it, then stop
            return
        raise Stopped(signum)
