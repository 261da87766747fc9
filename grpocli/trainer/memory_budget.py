"""How much memory a pass may take, and what it took: one object for a GPU and a CPU alike.

On a CUDA device the budget is the device (torch raises `torch.OutOfMemoryError` itself) or, with
train.memory_limit, that many bytes of `torch.cuda.max_memory_allocated`. On a CPU it is
train.memory_limit checked against the process's peak resident set (the kernel's VmHWM, reset before
each pass through /proc/self/clear_refs): a pass that crossed it raises `OutOfMemory` when it ends,
as a CUDA allocation past the device would have raised during it. Either way the step
(grpocli.trainer.resizing) splits its micro-batches and redoes the step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

GIB = 2**30
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


class OutOfMemory(Exception):
    """A pass took more than the budget (or the device): `phase` 'training' or 'log-prob', the
    sequences and the longest sequence of the micro-batch that failed on this process."""

    def __init__(self, phase: str, sequences: int = 0, longest: int = 0, peak: int = 0, limit: int = 0) -> None:
        self.phase, self.sequences, self.longest, self.peak, self.limit = phase, sequences, longest, peak, limit
        said = f", {gib(peak)} of a {gib(limit)} limit" if limit else ""
        super().__init__(f"out of memory in a {phase} micro-batch of {sequences} sequence(s) of up to "
                         f"{longest} tokens{said}")


def is_out_of_memory(exc: BaseException) -> bool:
    """A CUDA (or other accelerator) allocation that failed, or a pass past train.memory_limit."""
    return isinstance(exc, (OutOfMemory, torch.OutOfMemoryError))


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / 2**20:.1f} MiB"


def resident_peak() -> int:
    """This process's peak resident set since the last reset (bytes; 0 where the kernel does not say)."""
    return _status_bytes("VmHWM")


def resident_now() -> int:
    """This process's resident set now (bytes; 0 where the kernel does not say)."""
    return _status_bytes("VmRSS")


def _status_bytes(name: str) -> int:
    try:
        found = re.search(rf"{name}:\s+(\d+)\s*kB", _STATUS.read_text())
    except OSError:
        return 0
    return int(found.group(1)) * 1024 if found else 0


@functools.cache
def _libc() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _trim() -> None:
    """glibc's malloc_trim(0): freed heap pages back to the system, so the resident set is what is in use
    (without it a pass's peak would include what an earlier, larger one freed and malloc kept)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


@dataclass
class MemoryBudget:
    """`limit`: bytes a pass may take (None: the device's own, where torch raises on its own);
    `device`: where the passes run. `peak` is the largest seen since `clear_step`."""

    limit: int | None
    device: torch.device
    step_peak: int = field(default=0, init=False)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def watching(self) -> bool:
        """Whether there is a limit to check after each pass (a CPU, or a GPU with train.memory_limit)."""
        return self.limit is not None

    def start(self) -> None:
        """Forget the peak before a pass, so the next `check` sees the pass's own."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.watching:
            _trim()  # what earlier passes freed goes back to the system, as torch.cuda.empty_cache would
            try:
                _CLEAR_REFS.write_text("5")  # resets VmHWM to the current resident set (Linux 4.0+)
            except OSError:
                pass

    def peak(self) -> int:
        return int(torch.cuda.max_memory_allocated(self.device)) if self.cuda else resident_peak()

    def check(self, phase: str, sequences: int, longest: int) -> None:
        """OutOfMemory when the pass just run took more than the limit; the step's peak kept either way (on a CPU
        only with a limit: without one, the resident set's peak is not reset between passes)."""
        if not (self.cuda or self.watching):
            return
        used = self.peak()
        self.step_peak = max(self.step_peak, used)
        if self.limit is not None and used > self.limit:
            raise OutOfMemory(phase, sequences, longest, peak=used, limit=self.limit)

    def clear_step(self) -> int:
        """The peak of the step that ended (bytes), and start counting the next one's."""
        peak, self.step_peak = self.step_peak, 0
        return peak


__all__ = ["MemoryBudget", "OutOfMemory", "gib", "is_out_of_memory", "resident_now", "resident_peak"]
