"""What a failed reward call turns into: masked rows, the UserError that stops the run, or None scores.

A reward that raised, called ``sys.exit()`` or ``os._exit()``, or ran past its timeout:

* ``on_error = "mask"`` (the default, ``mask_rows``): the batch's rows are scored again one by one,
  within MAX_SECONDS_TO_RESCORE; a row that scores alone keeps its score, the others (failed, or
  not reached in time) are *masked*: no score, left out of their group's statistics and of the
  loss (grpocli.trainer.rollouts). A reward server that failed for the whole batch, or an event
  loop an async reward blocked, masks the whole batch. One warning line per failed batch says
  which rows and the slowest rows scored alone.
* ``"raise"`` (``fail``): one message naming the reward, the row (found by scoring the batch
  again row by row) and what to do; TRL's behaviour.
* ``"none"``: the batch scores None (counted as 0 in the weighted sum, as TRL's nansum).

A call that timed out cannot be stopped (Python has no way to kill a thread) and may go on in its
thread: under ``"none"`` a warning each time says how many such calls of the reward still run,
and at MAX_LEFT_RUNNING (either mode) the run stops, before they take the CPU and memory of
every step.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError
from grpocli.rewards.invocation import Failed, ProcessExit, RewardTimeout, is_async, raised_at, still_running
from grpocli.rewards.watchdog import refuses_threads

if TYPE_CHECKING:
    from grpocli.rewards.scoring import RewardFn

MAX_ROWS_TO_LOCATE = 256  # a failing batch is re-scored row by row to name the row
MAX_SECONDS_TO_LOCATE = 30.0
#: on_error = "mask": how long the rows of a failed batch are scored alone; rows not reached are masked.
MAX_SECONDS_TO_RESCORE = 30.0
SLOWEST_SHOWN = 3  # rows scored alone that the warning names, slowest first
#: Calls of one reward that timed out and still run (in threads left behind) at which the run stops.
MAX_LEFT_RUNNING = 4

#: Scores one row of the batch alone, within a timeout (None: no bound): its outcome or Failed.
Rescore = Callable[[int, "float | None"], Any]


def fail(i: int, rf: RewardFn, exc: BaseException, completions: list, columns: dict[str, list],
         timeout: float | None, rescore: Rescore) -> None:
    """Raise the UserError for reward ``i`` that failed with ``exc`` on this batch, unless its
    on_error = "none" keeps the run going (warning about timed-out calls that still run)."""
    if isinstance(exc, UserError):
        if exc.where is None:
            raise UserError(exc.what, where=f"rewards[{i}] ({rf.name})", valid=exc.valid, hint=exc.hint) from exc
        raise exc
    if rf.on_error == "none":
        if isinstance(exc, RewardTimeout):
            _left_running(i, rf, exc, timeout, len(completions))
        elif getattr(exc, "whole_batch", False):  # a reward server's failure: said, as it may last
            print(f"warning: reward {rf.name!r} {exc}; it scores this batch of {len(completions)} None "
                  '(on_error = "none")', file=sys.stderr, flush=True)
        return
    row = None
    whole = getattr(exc, "blocked_loop", False) or getattr(exc, "whole_batch", False)
    if not whole:  # a blocked loop would only block again; a reward server's failure is the batch's
        row = _locate_row(rescore, type(exc), len(completions), timeout)
    place = f"on a batch of {len(completions)} completions"
    if row is not None:
        place = f"on row {row} (completion {short(completions[row])})"
    what, hint = _failure(i, rf, exc, timeout, columns)
    raise UserError(f"reward {rf.name!r} {what} {place}{_origin(exc)}", where=f"rewards[{i}] ({rf.name})",
                    hint=hint) from exc


def _failure(i: int, rf: RewardFn, exc: BaseException, timeout: float | None,
             columns: dict[str, list], instead: str | None = None) -> tuple[str, str]:
    """What went wrong in words, and what to do about it (``instead``: the other way out than a fix)."""
    none = instead or (f'set on_error = "mask" in [[rewards]] entry {i} to leave the rows it fails on out of '
                       'training, or on_error = "none" to score such batches None')
    if getattr(exc, "whole_batch", False):  # grpocli.rewards.remote: its servers failed, or it raised there
        return str(exc), f"{getattr(exc, 'hint', 'fix the reward')}; or {none}"
    if isinstance(exc, RewardTimeout) and exc.blocked_loop:
        return (f"timed out: {exc}, and the event loop that async rewards share stopped answering",
                (f"an `async def` reward must await, never block (time.sleep, requests, a lock): use "
                 f"asyncio.sleep or an async client, or make it a plain def (rewards[{i}].timeout then "
                 "bounds it in a thread of its own)"))
    if isinstance(exc, RewardTimeout):
        seconds = timeout if timeout is not None else exc.seconds
        return (f"timed out: {exc}",
                (f"if it is only slow, raise rewards[{i}].timeout (now {seconds:g} s; 0 = no limit); if "
                 f"it hangs (a network call without a timeout, a lock, input()), fix the function; or {none}"))
    if isinstance(exc, (SystemExit, ProcessExit)):
        call = "sys.exit" if isinstance(exc, SystemExit) else "os._exit"
        stopped = "" if isinstance(exc, SystemExit) else " (grpo stopped this call before it ended the process)"
        return (f"called {call}({exc.code!r})",
                (f"a reward must return one score per completion and never end the process{stopped}: return "
                 f"None for a completion it cannot score, or raise an exception; or {none}"))
    if isinstance(exc, TypeError) and "unexpected keyword argument" in str(exc):
        return (f"raised TypeError: {exc}",
                (f"add **kwargs to the function's parameters: like TRL, it receives every dataset column "
                 f"({', '.join(sorted(columns)) or 'none'}) and its args by name"))
    if refuses_threads(exc):
        return f"raised {type(exc).__name__}: {exc}", _main_thread_hint(i, rf)
    return f"raised {type(exc).__name__}: {exc}", f"fix the function, or {none}"


def _main_thread_hint(i: int, rf: RewardFn) -> str:
    why = ("it sets a signal handler or alarm (signal.signal / signal.alarm, as math-verify's parse and verify "
           "do with their default timeouts), which Python allows only in the main thread")
    if is_async(rf.fn):
        return (f"{why}, and an `async def` reward runs on the event loop's thread: make it a plain def, which "
                "grpo runs in the main thread (its rewards[{i}].timeout still holds)".replace("{i}", str(i)))
    return (f"{why}; grpo runs such a reward in the main thread, but this call came from another thread "
            f"({threading.current_thread().name}): score from the main thread, or turn its own alarms off "
            "(math-verify: parse(..., parsing_timeout=None), verify(..., timeout_seconds=None)) and let "
            f"rewards[{i}].timeout bound it")


def _left_running(i: int, rf: RewardFn, exc: RewardTimeout, timeout: float | None, n: int) -> None:
    """Warn that a timed-out call goes on in its thread; UserError once MAX_LEFT_RUNNING do."""
    seconds = timeout if timeout is not None else exc.seconds
    raise_it = (f"if it is only slow, raise rewards[{i}].timeout (now {seconds:g} s; 0 = no limit); if it hangs "
                "or spins (a network call without a timeout, a lock, a loop that never ends), fix the function")
    if exc.stopped:
        print(f"warning: reward {rf.name!r} timed out (no result within {seconds:g} s) on a batch of {n} completions "
              f"and scores it None (on_error = \"none\"); the call was stopped{_origin(exc)}; {raise_it}",
              file=sys.stderr, flush=True)
        return
    if exc.still_running >= MAX_LEFT_RUNNING:
        raise _too_many_left(i, rf, exc, seconds, exc.still_running, raise_it)
    print(f"warning: reward {rf.name!r} timed out (no result within {seconds:g} s) on a batch of {n} completions "
          f"and scores it None (on_error = \"none\"); Python cannot stop the call, which goes on in a background "
          f"thread{_origin(exc)}: {exc.still_running} such call(s) of it still run, and at {MAX_LEFT_RUNNING} "
          f"the run stops; {raise_it}", file=sys.stderr, flush=True)


def _too_many_left(i: int, rf: RewardFn, exc: RewardTimeout, seconds: float, running: int, hint: str) -> UserError:
    return UserError(
        f"reward {rf.name!r} timed out again (no result within {seconds:g} s) and {running} of its "
        "calls that timed out still run in background threads, which Python cannot stop: each one takes CPU "
        f"and memory from every step{_origin(exc)}",
        where=f"rewards[{i}] ({rf.name})",
        valid=f"calls that return within the timeout, or end soon after it (the run stops when "
        f"{MAX_LEFT_RUNNING} still run)",
        hint=hint,
    )


@dataclass(frozen=True)
class MaskedRows:
    """What on_error = "mask" made of a failed batch call (``mask_rows``)."""

    values: list[float | None]        # [N] a row's score where it scored alone, None where masked
    masked: list[bool]                # [N] True: the reward could not score the row
    failure: tuple[str, str]          # what the batch call did ("raised ValueError: ... at f.py:3"), what to do
    slowest: list[tuple[float, int]]  # (seconds, row) of the rows scored alone, slowest first (SLOWEST_SHOWN)
    seconds: list[float | None] = field(default_factory=list)  # [N] each row scored alone: its seconds; None: not


def mask_rows(i: int, rf: RewardFn, exc: BaseException, n: int, timeout: float | None, rescore: Rescore,
              check: Callable[[Any], float | None]) -> MaskedRows:
    """on_error = "mask": score the rows of the batch reward ``i`` failed on (with ``exc``) again one by
    one, within MAX_SECONDS_TO_RESCORE; ``check`` turns a row's result into its score (UserError for
    an invalid one). The rows that fail alone, and those not reached in time, are masked; a reward
    server's failure or a blocked event loop masks them all. A UserError (grpo's own words) stops
    the run as under every on_error; so do MAX_LEFT_RUNNING calls that timed out and still run."""
    if isinstance(exc, UserError):
        fail(i, rf, exc, [], {}, timeout, rescore)
    what, hint = _failure(i, rf, exc, timeout, {}, instead=f"raise rewards[{i}].max_masked_share")
    values: list[float | None] = [None] * n
    masked = [True] * n
    times: list[tuple[float, int]] = []  # (seconds, row) of each row scored alone
    timed_out = exc if isinstance(exc, RewardTimeout) else None
    whole = getattr(exc, "blocked_loop", False) or (getattr(exc, "whole_batch", False)
                                                    and not getattr(exc, "rows_alone", False))
    deadline = time.monotonic() + MAX_SECONDS_TO_RESCORE
    for row in range(0 if whole else n):
        left = deadline - time.monotonic()
        if left <= 0 or still_running(rf.fn) >= MAX_LEFT_RUNNING:
            break
        t0 = time.perf_counter()
        outcome = rescore(row, None if timeout is None else min(timeout, left))
        times.append((time.perf_counter() - t0, row))
        if not isinstance(outcome, Failed):
            values[row], masked[row] = check(outcome), False
        elif isinstance(outcome.exc, UserError):
            fail(i, rf, outcome.exc, [], {}, timeout, rescore)
        elif isinstance(outcome.exc, RewardTimeout):
            timed_out = outcome.exc
    running = still_running(rf.fn) if timed_out is not None and not timed_out.stopped else 0
    if running >= MAX_LEFT_RUNNING:
        seconds = timeout if timeout is not None else timed_out.seconds
        raise _too_many_left(i, rf, timed_out, seconds, running, f"raise rewards[{i}].timeout (now {seconds:g} s) "
                             "if it is only slow; if it hangs or spins, fix the function")
    out = MaskedRows(values, masked, (f"{what}{_origin(exc)}", hint), sorted(times, reverse=True)[:SLOWEST_SHOWN],
                     _by_row(times, n))
    _warn_masked(rf, out, len(times), sum(t for t, _ in times), running, whole)
    return out


def _by_row(times: list[tuple[float, int]], n: int) -> list[float | None]:
    """[N] the seconds of each row scored alone (None: not scored alone)."""
    out: list[float | None] = [None] * n
    for seconds, row in times:
        out[row] = seconds
    return out


def _warn_masked(rf: RewardFn, out: MaskedRows, tried: int, seconds: float, running: int, whole: bool) -> None:
    """One line per failed batch: which rows are masked, the slowest rows scored alone."""
    n, rows = len(out.masked), [r for r, m in enumerate(out.masked) if m]
    shown = ", ".join(map(str, rows[:10])) + (" ..." if len(rows) > 10 else "")
    if whole:
        said = f"all {n} rows masked (no row can be scored alone)"
    else:
        said = f"{len(rows)} of {n} rows masked ({shown}); {tried} scored alone in {seconds:.1f} s"
        said += f", {n - tried} not reached in time" if tried < n else ""
    slow = ", ".join(f"{t:.2f} s (row {r})" for t, r in out.slowest)
    print(f"warning: reward {rf.name!r} {out.failure[0]} on a batch of {n} completions: {said}"
          + (f"; slowest alone: {slow}" if slow else "")
          + (f"; {running} of its calls that timed out still run (at {MAX_LEFT_RUNNING} the run stops)" if running
             else "") + ' (on_error = "mask": masked rows are left out of their group and of the loss)',
          file=sys.stderr, flush=True)


def stop_past_masked_share(fns: list[RewardFn], scores: Any, when: str) -> None:
    """UserError for the first reward that masked more than its ``max_masked_share`` of the samples of
    ``scores`` (grpocli.rewards.scoring.Scores), scored ``when`` ("at step 3")."""
    for i, rf in enumerate(fns):
        rows = scores.masked.get(rf.name, [])
        share = sum(rows) / len(rows) if rows else 0.0
        if share > rf.max_masked_share:
            what, hint = scores.failures.get(rf.name, ("failed", "fix the function"))
            raise UserError(
                f"reward {rf.name!r} could not score {sum(rows)} of {len(rows)} samples {when} ({share:.0%}, past "
                f"rewards[{i}].max_masked_share = {rf.max_masked_share:g}): it {what}",
                where=f"rewards[{i}] ({rf.name})",
                valid=f"a share of masked samples up to rewards[{i}].max_masked_share (0 to 1)",
                hint=(f"{hint}; the warnings above name the rows it failed on; rewards[{i}].on_error = \"raise\" "
                      "stops at its first failure, naming the row"),
            )


def _locate_row(rescore: Rescore, exc_type: type, n: int, timeout: float | None) -> int | None:
    """The first row that fails the same way when scored alone (None if none does, or if looking
    takes longer than MAX_SECONDS_TO_LOCATE; each row gets the reward's timeout or what is left)."""
    deadline = time.monotonic() + MAX_SECONDS_TO_LOCATE
    for row in range(min(n, MAX_ROWS_TO_LOCATE)):
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        outcome = rescore(row, None if timeout is None else min(timeout, left))
        if isinstance(outcome, Failed) and isinstance(outcome.exc, exc_type):
            return row
    return None


def _origin(exc: BaseException) -> str:
    """' at file:line' where it was raised, in the reward's own code where it can (past the
    standard library and installed packages); for a call that timed out, where it was waiting."""
    if isinstance(exc, RewardTimeout):
        return f" (waiting at {exc.stuck_at})" if exc.stuck_at else ""
    if getattr(exc, "whole_batch", False):  # raised by grpo's HTTP client, not the reward's code
        return ""
    at = raised_at(exc)
    return f" at {at}" if at else ""


def short(value: Any) -> str:
    """A value as a message shows it: its repr (a message list: its last content), at most 80 characters."""
    import reprlib

    shown = (value if not isinstance(value, list) or not value or not isinstance(value[0], dict)
             else value[-1].get("content", value))
    bounded = reprlib.Repr()  # a 10**6-row list or a 10 MB string: not all of it
    bounded.maxstring = bounded.maxother = bounded.maxlong = 80
    bounded.maxlist = bounded.maxtuple = bounded.maxdict = bounded.maxset = 20
    try:
        text = bounded.repr(shown)
    except Exception:  # noqa: BLE001 - an int past 4300 digits (str() refuses it), a __repr__ that raises
        text = f"<a value of type {type(shown).__name__} that cannot be shown>"
    return text if len(text) <= 80 else text[:77] + "..."
