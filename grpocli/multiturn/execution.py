"""A turn's tool calls, run concurrently with a per-call timeout; failures become messages.

Each rollout's calls run in order in a thread of their own (an environment sees its calls one
at a time, as the model wrote them); the rollouts' threads run at once. A call that raises
becomes ``Error: <type>: <message>``; one that calls ``sys.exit()`` or ``os._exit()`` says so at
once, and a warning says it once per tool (in a thread, sys.exit would end the thread without a
word and the call wait out its timeout; os._exit would end the process: while tools run it
raises instead, grpocli.rewards.invocation.exits_caught); one that runs past the timeout becomes
a timeout message and its thread is abandoned (a daemon: it can neither hold up the step nor
the process exit), together with the calls after it in that rollout. Nothing a tool does stops
the step. A result is text from outside: a lone surrogate in it becomes U+FFFD (``well_formed``).
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpocli.multiturn.parsers import ToolCall
from grpocli.rewards.invocation import ProcessExit, exits_caught

SURROGATES = re.compile("[\ud800-\udfff]")
_warned: set[tuple[str, str]] = set()  # (tool, "sys.exit" | "os._exit") already said on stderr
_warned_lock = threading.Lock()


@dataclass
class Outcome:
    """The result of one call as the model will read it, and how it went."""

    content: str
    error: bool = False      # raised, unknown tool, bad arguments, unparsed call, or timed out
    timed_out: bool = False


class _Worker:
    """One rollout's calls, run in order in a daemon thread."""

    def __init__(self, calls: list[ToolCall], functions: dict[str, Callable[..., Any]],
                 done: threading.Condition) -> None:
        self.calls, self.functions, self.done = calls, functions, done
        self.outcomes: list[Outcome | None] = [None] * len(calls)
        self.started_at: float | None = None  # start of the call running now
        self.abandoned = False
        self.thread = threading.Thread(target=self._run, daemon=True, name="grpo-tool")

    def _run(self) -> None:
        for k, call in enumerate(self.calls):
            with self.done:
                if self.abandoned:
                    return
                self.started_at = time.monotonic()
            try:
                outcome = run_call(call, self.functions)
            except BaseException as exc:  # noqa: BLE001 - whatever ends a thread must not leave the turn waiting
                outcome = Outcome(well_formed(f"Error: the tool {call.name!r} raised {type(exc).__name__}: {exc}"),
                                  error=True)
            with self.done:
                if self.abandoned:
                    return
                self.outcomes[k] = outcome
                self.started_at = None
                self.done.notify_all()

    @property
    def finished(self) -> bool:
        return self.abandoned or all(o is not None for o in self.outcomes)


def run_call(call: ToolCall, functions: dict[str, Callable[..., Any]]) -> Outcome:
    """One call in this thread: its result as text, or the error as text."""
    if call.error is not None:
        return Outcome(f"Error: {call.error}", error=True)
    fn = functions.get(call.name)
    if fn is None:
        return Outcome(f"Error: unknown tool {call.name!r}; the tools are: {', '.join(sorted(functions))}",
                       error=True)
    try:
        result = fn(**call.arguments)
    except Exception as exc:  # noqa: BLE001 (the tool's own failure: the model reads it, the step goes on)
        return Outcome(well_formed(f"Error: {type(exc).__name__}: {exc}"), error=True)
    except (SystemExit, ProcessExit) as exc:  # a tool must not end the process, nor its thread without a word
        how = "sys.exit" if isinstance(exc, SystemExit) else "os._exit"
        _warn_once(call.name, how, f"{how}({exc.code!r})")
        return Outcome(f"Error: the tool {call.name!r} called {how}({exc.code!r})", error=True)
    return Outcome(well_formed(result if isinstance(result, str) else str(result)))


def well_formed(text: str) -> str:
    """``text`` with each lone surrogate (``"\\ud800"``: no UTF-8 form, refused by every tokenizer)
    as U+FFFD: a tool's or environment's text, whatever it holds, reaches the model."""
    return SURROGATES.sub("\ufffd", text)


def _warn_once(tool: str, how: str, called: str) -> None:
    with _warned_lock:
        if (tool, how) in _warned:
            return
        _warned.add((tool, how))
    print(f"warning: the tool {tool!r} called {called}: a tool must return its result and never end the "
          "process; the model reads it as an error result and the run goes on (said once per tool)",
          file=sys.stderr, flush=True)


def run_turn(calls: list[list[ToolCall]], functions: list[dict[str, Callable[..., Any]]],
             timeout: float) -> list[list[Outcome]]:
    """The outcomes of every rollout's calls (`calls[i]` with the tools `functions[i]`), each call
    bounded by `timeout` seconds from its start; returns within about that per call."""
    done = threading.Condition()
    workers = [_Worker(c, f, done) for c, f in zip(calls, functions, strict=True)]
    with exits_caught():  # os._exit in a tool: an error result, not the end of the process
        for w in workers:
            w.thread.start()
        with done:
            while not all(w.finished for w in workers):
                now = time.monotonic()
                for w in workers:
                    if not w.finished and w.started_at is not None and now - w.started_at >= timeout:
                        _abandon(w, timeout)
                running = [w.started_at for w in workers if not w.finished and w.started_at is not None]
                wait = min((s + timeout - now for s in running), default=0.05)
                done.wait(max(wait, 0.001))
    return [[o for o in w.outcomes if o is not None] for w in workers]


def _abandon(w: _Worker, timeout: float) -> None:
    """Give up a worker whose current call ran past the timeout (the lock is held)."""
    k = w.outcomes.index(None)
    w.outcomes[k] = Outcome(f"Error: the tool {w.calls[k].name!r} did not return within {timeout:g} s "
                            "(timed out)", error=True, timed_out=True)
    for j in range(k + 1, len(w.calls)):
        w.outcomes[j] = Outcome(f"Error: not run: the call before it in this turn timed out ({w.calls[k].name!r})",
                                error=True)
    w.abandoned = True
