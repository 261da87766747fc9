"""Each row's seconds of a reward: what the reward reports, what the scorer keeps, the slowest.

A reward is called once per batch (TRL's contract), so grpo itself knows only the wall seconds of
each reward's batch call (``rewards/<name>/seconds``). A reward that does its work one completion at
a time says what each took through the keyword ``log_row_seconds(values)`` (declared with the others
in ``grpocli.registry.hookspecs.RewardFunction``): one wall-seconds value per completion, None where
it measured none. Only a reward that names the keyword gets it (or grpo's own, marked
``takes_row_seconds``), not one that takes just ``**kwargs``. The built-ins math.accuracy
(math-verify per answer), code.tests (its sandbox runs per completion, summed) and judge (each
request) report them through ``RowClock``; a reward served by ``grpo reward-serve`` reports them
when its own function does (``row_seconds`` of the answer). After a failed batch under on_error =
"mask", each row scored alone has its seconds measured by grpo (grpocli.rewards.failures.mask_rows).
Where only the batch time is known, no row has seconds.
"""

from __future__ import annotations

import inspect
import math
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any


class RowClock:
    """A reward's side: times each row (``with clock.row(i): ...``, or ``add``), then ``report``
    hands the values to ``log_row_seconds`` when grpo passed it (found in the call's ``kwargs``)."""

    def __init__(self, n: int, kwargs: Mapping[str, Any]) -> None:
        self.seconds: list[float | None] = [None] * n
        self._log = kwargs.get("log_row_seconds")
        self._lock = threading.Lock()  # rows timed from several threads (code.tests' sandbox pool)

    def add(self, row: int, seconds: float) -> None:
        with self._lock:
            self.seconds[row] = (self.seconds[row] or 0.0) + seconds

    @contextmanager
    def row(self, row: int) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(row, time.perf_counter() - t0)

    def report(self) -> None:
        if callable(self._log):
            self._log(list(self.seconds))


def takes(fn: Any) -> bool:
    """Whether ``fn`` gets ``log_row_seconds``: it names it, or is grpo's own and says so
    (``fn.takes_row_seconds``). A reward that only takes ``**kwargs`` does not get it: such a
    function may treat every keyword beyond TRL's as a dataset column."""
    if getattr(fn, "takes_row_seconds", False):
        return True
    try:
        return "log_row_seconds" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def keyword(fn: Any, log: Any) -> dict[str, Any]:
    """``{"log_row_seconds": log}`` for a reward that takes it (``takes``), else nothing."""
    return {"log_row_seconds": log} if takes(fn) else {}


def ignored(values: list[Any]) -> None:
    """``log_row_seconds`` where nothing keeps what a reward reports (a row scored alone: grpo times it)."""


class RowSeconds:
    """The scorer's side, one per reward and batch: what ``log_row_seconds`` reported (``values``,
    None when nothing was; a report of another length than the batch, or of values that are no
    seconds, counts as nothing for those values)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.values: list[float | None] | None = None

    def log_row_seconds(self, values: list[Any]) -> None:
        values = list(values)
        if len(values) == self.n:
            self.values = [_seconds(v) for v in values]

    def rescored(self, seconds: list[float | None]) -> None:
        """The rows of a failed batch scored alone (their seconds as grpo measured them; None: not reached)."""
        self.values = list(seconds)


def _seconds(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) and number >= 0 else None


def collected(names: list[str], found: list[RowSeconds], timeouts: list[float | None]) -> dict[str, list[float | None]]:
    """Each reward's row seconds where some row has them (``warn_slow`` said of the slow ones)."""
    out = {name: f.values for name, f in zip(names, found)
           if f.values is not None and any(v is not None for v in f.values)}
    warn_slow(names, timeouts, out)
    return out


def slowest(values: list[float | None]) -> tuple[float, int] | None:
    """(seconds, row) of the slowest row with seconds; None when none has."""
    known = [(v, row) for row, v in enumerate(values) if v is not None]
    return max(known) if known else None


def warn_slow(names: list[str], timeouts: list[float | None], row_seconds: dict[str, list[float | None]]) -> None:
    """One warning line per reward whose slowest row took more than half its timeout."""
    for i, (name, timeout) in enumerate(zip(names, timeouts)):
        found = slowest(row_seconds.get(name, []))
        if timeout is None or found is None or found[0] <= timeout / 2:
            continue
        seconds, row = found
        n = len(row_seconds[name])
        print(f"warning: reward {name!r} took {seconds:.2f} s on row {row} of a batch of {n}, more than half of "
              f"rewards[{i}].timeout = {timeout:g} s: raise rewards[{i}].timeout before rows time out and are "
              "masked, or make the reward faster", file=sys.stderr, flush=True)


def slowest_metrics(parallel: Any, names: list[str], row_seconds: dict[str, list[float | None]]) -> dict[str, float]:
    """``rewards/<name>/slowest_seconds``: the slowest row of each reward over every process, for
    the rewards some row of which has seconds (every process calls it: it gathers)."""
    import torch

    mine = [max((v for v in row_seconds.get(n, []) if v is not None), default=-1.0) for n in names]
    every = parallel.gather(torch.tensor(mine, dtype=torch.float64)).view(-1, len(names)) if names else None
    if every is None:
        return {}
    return {f"rewards/{n}/slowest_seconds": float(t) for n, t in zip(names, every.max(dim=0).values.tolist())
            if t >= 0}
