"""The reward calls of `grpo reward-serve`: queued by the HTTP routes, run in the main thread in order.

Each request is one call of the reward on the batch it carries, with the keywords grpo gives a
reward in-process (grpocli.rewards.scoring.reward_kwargs: the columns by name, ``completion_ids``,
a ``transformers.TrainerState`` rebuilt from the fields sent, ``log_extra`` / ``log_metric``, the
entry's args), made through the same invocation (grpocli.rewards.invocation: async rewards on
their loop, ``--timeout`` per call, a sync reward that needs the main thread for its signal alarms,
math-verify's, in it). So calls run in the main thread, one at a time in arrival order (``Calls.run``),
while uvicorn serves in a thread of its own.

The reward is called with the args the operator fixed (grpocli.reward_server.fixed), never with
what a request chose: ``call_args``, which the route asks before it queues the call, refuses (422)
an arg the reward does not take, (403) one that does not repeat the server's (or pick an allowed
value), and (422) a dataset column named like an arg only the operator sets.

``score_batch`` answers one call as (HTTP status, JSON body): 200 the ScoreAnswer of
grpocli/wire/rewards.py; 500 ``{"detail", "failure": "raised"}`` for the reward's own failure (its
exception or timeout: the client's on_error decides) or ``"failure": "invalid"`` (it returned no
valid scores: a UserError there, as in-process); 422 for a batch whose parts differ in length.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from grpocli.errors import UserError
from grpocli.reward_server.fixed import FixedArgs, operator_args
from grpocli.serving.access import ServerError
from grpocli.wire.rewards import ScoreRequest, jsonable

_import_lock = threading.Lock()


@dataclass(frozen=True)
class Served:
    """A reward this server scores: the name clients send, the callable, its description, its args."""

    name: str
    fn: Any
    description: str = ""
    fixed: FixedArgs | None = None  # None: no args (a request may send none)

    def args(self) -> FixedArgs:
        return self.fixed or FixedArgs(self.name)


class Calls:
    """Reward calls queued by the routes and run by ``run`` in the main thread, in order."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.jobs: queue.Queue[tuple[Served, ScoreRequest, dict[str, Any], concurrent.futures.Future]] = queue.Queue()

    def submit(self, served: Served, req: ScoreRequest, args: dict[str, Any]) -> concurrent.futures.Future:
        """Queue a call of ``served`` on the request's batch with ``args`` (``call_args``'s)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.jobs.put((served, req, args, future))
        return future

    def run(self, alive: Any) -> None:
        """Answer queued calls until ``alive()`` turns false (the HTTP thread ended)."""
        while alive():
            try:
                served, req, args, future = self.jobs.get(timeout=1.0)
            except queue.Empty:
                continue
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(score_batch(served, req, args, self.timeout))
            except Exception as exc:  # noqa: BLE001 - grpo's own failure: answered, the server goes on
                future.set_result((500, {"detail": f"grpo reward-serve failed: {type(exc).__name__}: {exc}"}))


def call_args(served: Served, req: ScoreRequest) -> dict[str, Any]:
    """The args to call ``served`` with for ``req``: the server's, which the request's may only repeat
    (ServerError 422 for an arg the reward does not take, 403 for one the request may not set, 422
    for a column named like an arg only the operator sets)."""
    from grpocli.rewards.arguments import check_reward_args

    try:
        check_reward_args(0, served.name, served.fn, req.args)
    except UserError as err:
        raise ServerError(422, _said(err)) from None
    args = served.args().for_request(req.args)
    shadow = sorted(set(req.columns) & set(operator_args(served.fn)))
    if shadow:
        raise ServerError(422, f"columns.{shadow[0]}: a column may not be named like {served.name}'s {shadow[0]}, "
                               "an arg only the server's operator sets")
    return args


def score_batch(served: Served, req: ScoreRequest, args: dict[str, Any],
                timeout: float | None) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) of one call of ``served`` with ``args`` on the request's batch."""
    from grpocli.rewards.invocation import Failed, call_one
    from grpocli.rewards.scoring import RewardFn, RewardLog, check_values, reward_kwargs
    from grpocli.rewards.timings import RowSeconds, keyword

    n = len(req.completions)
    lengths = {"prompts": len(req.prompts), **{f"columns.{k}": len(v) for k, v in req.columns.items()}}
    if req.completion_ids is not None:
        lengths["completion_ids"] = len(req.completion_ids)
    for key, size in lengths.items():
        if size != n:
            return 422, {"detail": f"{key} has {size} rows for {n} completions"}
    rf = RewardFn(served.name, served.fn, args=dict(args))
    log = RewardLog()
    # a TrainerState (transformers' import) only for a reward that takes it
    state = rebuilt_state(req.trainer_state) if takes_state(served.fn) else None
    rows = RowSeconds(n)  # what the reward reports of each row's seconds (grpocli.rewards.timings)
    context = {"trainer_state": state, "log_extra": log.log_extra, "log_metric": log.log_metric,
               **keyword(served.fn, rows.log_row_seconds)}
    try:
        kwargs = reward_kwargs(0, rf, req.prompts, req.completions, req.columns, req.completion_ids, context)
    except UserError as err:
        return 422, {"detail": _said(err)}
    t0 = time.perf_counter()
    outcome = call_one(served.fn, kwargs, timeout)
    if isinstance(outcome, Failed):
        return 500, {"detail": _described(outcome.exc), "failure": "raised"}
    try:
        scores = check_values(0, rf, outcome, n)
        logged = {"log_extra": jsonable(log.columns), "log_metric": jsonable(log.metrics)}
    except UserError as err:
        return 500, {"detail": err.what, "failure": "invalid"}
    except (TypeError, ValueError) as exc:
        return 500, {"detail": f"reward {served.name!r} logged values JSON cannot carry: {exc}", "failure": "invalid"}
    timed = {"row_seconds": rows.values} if rows.values and any(v is not None for v in rows.values) else {}
    return 200, {"scores": scores, **logged, "seconds": round(time.perf_counter() - t0, 6), **timed}


def _said(err: UserError) -> str:
    return "; ".join([err.what] + [f"{k}: {v}" for k, v in (("valid", err.valid), ("next", err.hint)) if v])


def takes_state(fn: Any) -> bool:
    """Whether ``fn`` gets the trainer_state keyword (it names it, or takes **kwargs)."""
    from grpocli.rewards.invocation import keyword_names

    names = keyword_names(fn)
    return names is None or "trainer_state" in names


def rebuilt_state(fields: dict[str, Any] | None) -> Any:
    """A ``transformers.TrainerState`` from the fields the client sent (its defaults for the others)."""
    import dataclasses

    with _import_lock:  # transformers' lazy import is not safe from two threads at once
        from transformers import TrainerState

    if fields is None:
        return TrainerState()
    known = {f.name for f in dataclasses.fields(TrainerState)}
    return TrainerState(**{k: v for k, v in fields.items() if k in known})


def _described(exc: BaseException) -> str:
    from grpocli.rewards.invocation import RewardTimeout, raised_at

    if isinstance(exc, RewardTimeout):
        return f"timed out: {exc}" + (f" (waiting at {exc.stuck_at})" if exc.stuck_at else "")
    at = raised_at(exc)
    return f"raised {type(exc).__name__}: {exc}" + (f" at {at}" if at else "")


__all__ = ["Calls", "Served", "call_args", "rebuilt_state", "score_batch", "takes_state"]
