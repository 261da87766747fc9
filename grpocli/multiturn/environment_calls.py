"""An environment's own methods, called by the turn loop as tools are: bounded in time, exits named.

The constructor (one instance per rollout), ``reset(**row)``, ``respond(messages)`` and
``get_metrics()`` each run in a daemon thread of their own, bounded by
``multi_turn.environment_timeout`` seconds (as a tool call is by ``tool_timeout``; an OpenEnv step
is ``respond``, a verifiers ``env_response`` too). A call past it, one that raises, or one that
calls ``sys.exit()`` or ``os._exit()`` (which raises while it runs: grpocli.rewards.invocation's
``exits_caught``) stops the run: exit 2 naming the environment, the method and what it did, where
it waits or ended, and for a timeout the key to raise. (Without the bound, an OpenEnv step that
slept hung the run without a word, and one that exited ended it silently with its code.) A call
given up keeps running in its daemon thread, which can hold up neither the step nor the exit.
An environment that refuses a thread (it sets a signal handler: verifiers' loaders do) is called
again in the main thread, as rewards are, and there from then on, the watchdog stopping a call at
the timeout (grpocli.rewards.watchdog).

What an environment returns is text from outside: a lone surrogate in it (``"\\ud800"``, which no
tokenizer encodes and UTF-8 cannot hold) becomes U+FFFD (``well_formed``), as it does in a tool's
result (grpocli.multiturn.execution).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import traceback
from collections.abc import Callable
from typing import Any

from grpocli.errors import Stopped, UserError
from grpocli.multiturn.execution import well_formed
from grpocli.rewards.invocation import ProcessExit, exits_caught, place, raised_at, thread_at
from grpocli.rewards.watchdog import Deadline, call_in_main_thread, in_main_thread, refuses_threads

WHERE = "multi_turn.environment"
KEY = "multi_turn.environment_timeout"


class EnvironmentCalls:
    """The environment's methods of one turn loop, each call bounded by ``timeout`` seconds; ``name``
    says which environment in messages (``environment 'guess_number'``)."""

    def __init__(self, name: str, timeout: float) -> None:
        self.name, self.timeout = name, timeout
        self.main_thread = False  # calls run in the main thread (under the watchdog): it refused a thread

    def new(self, factory: Callable[[], Any]) -> Any:
        """A fresh instance (the factory with its environment_args)."""
        return self.call("the constructor", factory, "a class or factory that takes [multi_turn] environment_args "
                         "as keyword arguments")

    def reset(self, env: Any, row: dict[str, Any]) -> str:
        """Start an environment on a dataset row (TRL's reset(**row)); the text it returns, or ''."""
        if env is None or not callable(getattr(env, "reset", None)):
            return ""
        columns = {k: v for k, v in row.items() if k != "prompt_text"}
        observation = self.call("reset()", lambda: env.reset(**columns),
                                "reset(**row) taking the dataset's columns as keyword arguments (or **kwargs)")
        return "" if observation is None else well_formed(str(observation))

    def respond(self, env: Any, messages: list[dict[str, Any]]) -> str | None:
        """The environment's answer to the model's turn: the next user message, or None (the end)."""
        text = self.call("respond()", lambda: env.respond(messages),
                         "respond(messages) -> str | None: the next user message, or None to end the rollout")
        return None if text is None else well_formed(str(text))

    def metrics(self, envs: list[Any]) -> dict[str, float]:
        """The sums over rollouts of each environment's optional ``get_metrics()`` (a dict of numbers)."""
        out: dict[str, float] = {}
        for env in envs:
            method = getattr(env, "get_metrics", None)
            if callable(method):
                found = self.call("get_metrics()", method, "get_metrics() -> dict of numbers")
                for name, value in (found or {}).items():
                    out[name] = out.get(name, 0.0) + self._number(name, value)
        return out

    def _number(self, name: str, value: Any) -> float:
        try:
            return float(value)
        except (TypeError, ValueError, OverflowError):  # 10**400 too
            shown = f"a {type(value).__name__}" if isinstance(value, int) else repr(value)[:80]
            raise UserError(f"get_metrics() of the {self.name} gave {name!r} = {shown}, not a float", where=WHERE,
                            valid="get_metrics() -> dict of numbers (each a float)", hint="fix get_metrics()") from None

    def call(self, method: str, fn: Callable[[], Any], valid: str) -> Any:
        """``fn()`` bounded by ``timeout`` seconds (in a daemon thread, or in the main thread under
        the watchdog once the environment refused a thread); its result, or UserError."""
        if self.main_thread and in_main_thread():
            box = _in_main(fn, self.timeout)
        else:
            box = _in_thread(fn, self.timeout)
            if _refuses_threads(box.get("error")) and in_main_thread():
                self.main_thread = True  # it sets a signal handler (verifiers' loaders do): the main thread from now on
                box = _in_main(fn, self.timeout)
        if "waiting" in box:
            at = box["waiting"]
            raise UserError(
                f"{method} of the {self.name} did not return within {self.timeout:g} s"
                + (f" (waiting at {at})" if at else ""), where=WHERE,
                valid=f"{valid}, returning within {KEY} ({self.timeout:g} s)",
                hint=f"if it is only slow, raise {KEY}=SECONDS (at most 3600); if it hangs (a network call "
                "without a timeout, a lock, a loop that never ends), fix it")
        if "error" not in box:
            return box.get("value")
        exc = box["error"]
        at = raised_at(exc)
        if isinstance(exc, (SystemExit, ProcessExit)):
            how = "sys.exit" if isinstance(exc, SystemExit) else "os._exit"
            raise UserError(f"{method} of the {self.name} called {how}({exc.code!r})" + (f" at {at}" if at else ""),
                            where=WHERE, valid=f"{valid}; an environment returns, it never ends the process",
                            hint="return (or raise an exception) instead of exiting") from None
        raise UserError(f"{method} of the {self.name} raised {type(exc).__name__}: {exc}"
                        + (f" at {at}" if at else ""), where=WHERE, valid=valid,
                        hint=f"fix {method}, or check multi_turn.environment_args and the dataset's columns") from None


def _in_thread(fn: Callable[[], Any], timeout: float) -> dict[str, Any]:
    """{"value": ...}, {"error": exc} or {"waiting": 'file:line'} of ``fn()`` in a daemon thread."""
    box: dict[str, Any] = {}
    thread = threading.Thread(target=_run, args=(fn, box), daemon=True, name="grpo-environment")
    with exits_caught():  # os._exit in the environment raises instead of ending the process
        thread.start()
        thread.join(timeout)
    return {"waiting": thread_at(thread)} if thread.is_alive() else box


def _in_main(fn: Callable[[], Any], timeout: float) -> dict[str, Any]:
    """As _in_thread, in this (the main) thread: the watchdog stops the call at ``timeout``."""
    box: dict[str, Any] = {}
    with exits_caught():
        try:
            call_in_main_thread(_run, {"fn": fn, "box": box}, timeout)
        except Deadline as exc:
            spots = [(f.filename, f.lineno or 0) for f in traceback.extract_tb(exc.__traceback__)]
            return {"waiting": place([s for s in spots if not s[0].endswith(("watchdog.py", __file__))])}
    if isinstance(box.get("error"), Deadline):
        return {"waiting": raised_at(box["error"])}
    return box


def _refuses_threads(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what it was raised from) is Python refusing a signal handler off the main thread."""
    seen = 0
    while exc is not None and seen < 8:
        if refuses_threads(exc) or "signal only works in main thread" in str(exc):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _run(fn: Callable[[], Any], box: dict[str, Any]) -> None:
    try:
        value = fn()
        if inspect.isawaitable(value):  # an async method: run here, on a loop of this thread's own
            value = asyncio.run(_awaited(value))
        box["value"] = value
    except (KeyboardInterrupt, Stopped):  # SIGINT / SIGTERM while it runs in the main thread: the run stops
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit and ProcessExit too: named by the caller
        box["error"] = exc


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


__all__ = ["EnvironmentCalls"]
