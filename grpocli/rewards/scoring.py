"""Score completions with the recipe's rewards: call each, check what it returned, combine.

Follows TRL's GRPOTrainer (``_calculate_rewards``): every reward gets ``prompts=``,
``completions=`` (and ``completion_ids=``) plus each dataset column by name; None means "does
not apply" and counts as 0 in the weighted sum (TRL's nansum); a reward that *fails* (raises, times
out, its server fails) under ``on_error = "mask"`` (the default; TRL raises: ``"raise"``) has the
rows it could not score masked (``Scores.masked``, grpocli.rewards.failures), not 0. The "gated"
combination is open-instruct's non-additive format reward: the other rewards count only where
every gate (format) reward is > 0.

TRL 1.16's other keywords reach them too (the reward contract's
``grpocli.registry.hookspecs.REWARD_KEYWORDS``): ``trainer_state`` (a
``transformers.TrainerState``: global_step, max_steps, epoch, ...), ``log_extra(column, values)``
(extra columns of the completions table) and ``log_metric(name, value)`` (a scalar averaged into
the step's metrics): what rewards log (`RewardLog`) lands in rollouts/step-N.jsonl (``extra``)
and metrics.jsonl. Completions are chat message lists exactly when TRL makes them so: when the
prompt is one (`trl_completions`).
"""

from __future__ import annotations

import math
import numbers
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from grpocli.errors import UserError
from grpocli.recipe.bounds import MAX_ABS_REWARD
from grpocli.rewards.arguments import RESERVED, check_reward_args
from grpocli.rewards.factories import build, is_factory
from grpocli.rewards.failures import fail, mask_rows, short
from grpocli.rewards.invocation import Failed, accepted_kwargs, call_all, call_one
from grpocli.rewards.references import lookup
from grpocli.rewards.timings import RowSeconds, collected, ignored, keyword

if TYPE_CHECKING:
    from grpocli.recipe.schema import RewardSpec
    from grpocli.registry import Registry

VALID_VALUES = (f"a list (or 1-D array) with one float, int, bool or None per completion, each within "
                f"+-{MAX_ABS_REWARD:g}, e.g. [1.0, 0.0, None]")


@dataclass
class RewardFn:
    """One [[rewards]] entry, resolved: a unique label, the function and how it counts."""

    name: str
    fn: Callable[..., Any]
    weight: float = 1.0
    args: dict[str, Any] = field(default_factory=dict)
    gate: bool = False
    on_error: Literal["mask", "raise", "none"] = "mask"
    timeout: float | None = None  # seconds per call; None: no bound (rewards[i].timeout, 0 = None)
    max_masked_share: float = 0.5  # share of a step's samples it may mask before the run stops


@dataclass
class RewardLog:
    """What rewards logged during one scoring call, through TRL's log_extra and log_metric."""

    columns: dict[str, list[Any]] = field(default_factory=dict)   # one value per completion
    metrics: dict[str, list[float]] = field(default_factory=dict)  # scalars, averaged when logged

    def log_extra(self, column: str, values: list[Any]) -> None:
        """TRL's ``log_extra``: a column of the completions table, one value per completion."""
        self.columns.setdefault(str(column), []).extend(list(values))

    def log_metric(self, name: str, value: float) -> None:
        """TRL's ``log_metric``: a scalar for this batch (ValueError, raised in the reward that logs it,
        for a number too large for a float)."""
        try:
            number = float(value)
        except OverflowError:
            raise ValueError(f"log_metric({name!r}, ...) got a number too large for a float "
                             f"({type(value).__name__})") from None
        self.metrics.setdefault(str(name), []).append(number)


@dataclass
class Scores:
    """Per-reward values (None where a reward does not apply or failed), the weighted total,
    how many rows each reward scored None because it raised (with on_error = "none"), and
    what the rewards logged (TRL's log_extra / log_metric); the rows each reward could not score
    (on_error = "mask": value None, total meaningless) and what it did; each reward's call seconds."""

    per_reward: dict[str, list[float | None]]
    total: list[float]
    errors: dict[str, int]
    logged: RewardLog = field(default_factory=RewardLog)
    masked: dict[str, list[bool]] = field(default_factory=dict)  # [N] each reward: True where it could not score
    failures: dict[str, tuple[str, str]] = field(default_factory=dict)  # each that masked rows: what it did, what to do
    seconds: dict[str, float] = field(default_factory=dict)      # each reward's batch call, wall seconds
    row_seconds: dict[str, list[float | None]] = field(default_factory=dict)  # [N] where known (timings)


def is_conversational(prompt: Any) -> bool:
    """TRL's test: a prompt that is a list of chat messages (dicts with a role)."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict) and "role" in prompt[0]


def trl_completions(prompts: list, completions: list) -> list:
    """Completions as TRL hands them to rewards: ``[{"role": "assistant", "content": text}]`` each
    when the prompts are conversational, the strings otherwise (message lists stay as they are)."""
    if not prompts or not is_conversational(prompts[0]):
        return completions
    return [c if isinstance(c, list) else [{"role": "assistant", "content": c}] for c in completions]


def trainer_state(*, global_step: int = 0, max_steps: int = 0, epoch: float = 0.0, num_tokens: int = 0) -> Any:
    """A ``transformers.TrainerState`` as TRL passes it (imported here, not at grpo --help)."""
    from transformers import TrainerState

    return TrainerState(global_step=global_step, max_steps=max_steps, epoch=epoch,
                        num_input_tokens_seen=num_tokens)


def combine_sum(values: list[list[float | None]], weights: list[float], gates: list[bool]) -> list[float]:
    """Weighted sum over rewards per row, None counted as 0 (TRL's nansum)."""
    rows = len(values[0]) if values else 0
    return [sum(w * (v[r] or 0.0) for v, w in zip(values, weights)) for r in range(rows)]


def combine_gated(values: list[list[float | None]], weights: list[float], gates: list[bool]) -> list[float]:
    """Gate rewards always count; the others only in rows where every gate reward is > 0."""
    gate_vals = [v for v, g in zip(values, gates) if g]
    rows = len(values[0]) if values else 0
    out = []
    for r in range(rows):
        opened = all((v[r] or 0.0) > 0 for v in gate_vals)
        out.append(sum(w * (v[r] or 0.0) for v, w, g in zip(values, weights, gates) if g or opened))
    return out


COMBINATIONS = {"sum": combine_sum, "gated": combine_gated}


def score(
    fns: list[RewardFn],
    prompts: list,
    completions: list,
    columns: dict[str, list],
    combination: Literal["sum", "gated"] = "sum",
    *,
    completion_ids: list | None = None,
    timeout: float | None = None,
    state: Any = None,
    doing: Callable[[str], None] | None = None,
) -> Scores:
    """Call every reward on the batch with TRL's keywords (grpocli.rewards.scoring), check and
    combine; ``state`` is the trainer_state they get. Each call is bounded by its RewardFn's
    ``timeout`` (seconds), or by ``timeout`` for all of them where given. Each reward gets its own
    copies of the batch (``fresh``): what one changes reaches neither the others nor the caller.
    ``doing`` is told which reward(s) run next (a process's status for the launcher's report)."""
    completions = trl_completions(prompts, completions)
    _check_batch(fns, prompts, completions, columns, completion_ids, combination)
    log = RewardLog()
    context = {"trainer_state": state if state is not None else trainer_state(),
               "log_extra": log.log_extra, "log_metric": log.log_metric}
    clocks = [RowSeconds(len(completions)) for _ in fns]  # what each reports of its rows (grpocli.rewards.timings)
    calls = [(rf.fn, reward_kwargs(i, rf, prompts, completions, columns, completion_ids,
                                   {**context, **keyword(rf.fn, clocks[i].log_row_seconds)}))
             for i, rf in enumerate(fns)]
    timeouts = [rf.timeout if timeout is None else timeout for rf in fns]
    before = None if doing is None else (lambda indices: doing(", ".join(repr(fns[k].name) for k in indices)))
    seconds: list[float] = []
    outcomes, n = call_all(calls, timeouts, before, seconds), len(completions)
    per_reward: dict[str, list[float | None]] = {}
    errors: dict[str, int] = {}
    masked, failures = {rf.name: [False] * n for rf in fns}, {}
    for i, (rf, outcome) in enumerate(zip(fns, outcomes)):
        if not isinstance(outcome, Failed):
            per_reward[rf.name] = check_values(i, rf, outcome, n)
        elif rf.on_error == "mask":  # the rows scored again one by one, those that fail masked
            found = mask_rows(i, rf, outcome.exc, n, timeouts[i], _rescorer(i, rf, prompts, completions, columns,
                              completion_ids, context), lambda one, i=i, rf=rf: check_values(i, rf, one, 1)[0])
            per_reward[rf.name], masked[rf.name], failures[rf.name] = found.values, found.masked, found.failure
            clocks[i].rescored(found.seconds)
        else:
            fail(i, rf, outcome.exc, completions, columns, timeouts[i],
                 _rescorer(i, rf, prompts, completions, columns, completion_ids, context))
            per_reward[rf.name], errors[rf.name] = [None] * n, n
    weights, gates = [rf.weight for rf in fns], [rf.gate for rf in fns]
    total = COMBINATIONS[combination](list(per_reward.values()), weights, gates)
    _check_totals(fns, per_reward, total)
    return Scores(per_reward, total, errors, log, masked, failures, {rf.name: t for rf, t in zip(fns, seconds)},
                  collected([rf.name for rf in fns], clocks, timeouts))


def fresh(value: Any) -> Any:
    """``value`` with every list, dict, tuple and set in it copied (other objects, strings, numbers,
    arrays, images, environments, are shared): a reward may change what it gets in place."""
    if isinstance(value, list):
        return [fresh(v) for v in value]
    if isinstance(value, dict):
        return {k: fresh(v) for k, v in value.items()}
    if isinstance(value, tuple) and not hasattr(value, "_fields"):  # a namedtuple is left as it is
        return tuple(fresh(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return type(value)(value)
    return value


def reward_metrics(scores: Scores) -> dict[str, float]:
    """TRL's per-reward metrics: rewards/<name>/mean and /std over non-None values (left out when
    every value is None), plus rewards/<name>/num_none and, where it raised, /num_errors (on_error =
    "none") or /masked (on_error = "mask": the rows it could not score, also in num_none)."""
    out: dict[str, float] = {}
    for name, values in scores.per_reward.items():
        present = [v for v in values if v is not None]
        if present:
            out[f"rewards/{name}/mean"] = statistics.fmean(present)
            out[f"rewards/{name}/std"] = statistics.stdev(present) if len(present) > 1 else 0.0
        out[f"rewards/{name}/num_none"] = float(len(values) - len(present))
        if scores.errors.get(name):
            out[f"rewards/{name}/num_errors"] = float(scores.errors[name])
        if any(scores.masked.get(name, ())):
            out[f"rewards/{name}/masked"] = float(sum(scores.masked[name]))
    return out


def resolve(specs: list[RewardSpec], registry: Registry) -> list[RewardFn]:
    """RewardFns from [[rewards]] entries (objects with name, weight, args, gate, on_error, timeout
    (0 or absent: no bound), max_masked_share (absent: 0.5), for reward models batch_size, device).

    A name is a registered reward, ``module:function``, ``path/to/file.py:function`` or a reward
    model directory (``grpocli.rewards.references``; registered names first). UserError for a
    name none of these resolves, a weight that is not finite, an unknown on_error, or an arg the
    reward does not accept (``grpocli.rewards.arguments``, which also runs a built-in's own
    ``check_args`` at preflight). A function that takes none of a
    reward's keywords is a factory, called once here with its args (``grpocli.rewards.factories``),
    and what it returns is the reward. Labels are TRL's: a function's name (a registered reward's
    name, a reward model's directory name, a factory's made function's name); where two different
    rewards share one, each takes its qualified label (``file.py:function`` without its directory,
    ``module:function``), and a label still repeated gets ``label#2``, ``label#3``... so metrics
    stay apart.
    """
    found_all = []
    for i, spec in enumerate(specs):
        found = lookup(spec, i, registry)
        _check_spec(i, spec, found.fn, remote=found.kind == "remote")
        found_all.append(found)
    sources: dict[str, set[str]] = {}  # label -> the rewards that have it
    for found in found_all:
        sources.setdefault(found.label, set()).add(found.qualified or found.label)
    out, seen = [], Counter()
    for i, (spec, found) in enumerate(zip(specs, found_all)):
        fn, args = found.fn, dict(spec.args)
        base = found.qualified or found.label if len(sources[found.label]) > 1 else found.label
        if found.kind == "remote":  # the server checks and passes the args (RemoteReward sends them)
            args = {}
        elif found.kind == "function" and is_factory(fn):  # TRL's get_soft_overlong_punishment(...) and the like
            (fn, base), args = build(fn, base, args, i), {}
        seen[base] += 1
        label = base if seen[base] == 1 else f"{base}#{seen[base]}"
        timeout = float(getattr(spec, "timeout", 0) or 0) or None
        out.append(RewardFn(label, fn, float(spec.weight), args, bool(spec.gate), spec.on_error, timeout,
                            float(getattr(spec, "max_masked_share", 0.5))))
    return out


def _check_spec(i: int, spec: RewardSpec, fn: Callable[..., Any], remote: bool = False) -> None:
    if not math.isfinite(float(spec.weight)):
        raise UserError(f"weight of reward {spec.name!r} is {spec.weight}", where=f"rewards[{i}].weight",
                        valid="a finite number")
    if spec.on_error not in ("mask", "raise", "none"):
        raise UserError(f"on_error is {spec.on_error!r}", where=f"rewards[{i}].on_error",
                        valid='"mask", "raise", "none"')
    timeout = float(getattr(spec, "timeout", 0) or 0)
    if not (math.isfinite(timeout) and timeout >= 0):
        raise UserError(f"timeout of reward {spec.name!r} is {timeout}", where=f"rewards[{i}].timeout",
                        valid="seconds >= 0 (0 = no limit)")
    if not remote:  # a served reward's args are checked by its server
        check_reward_args(i, spec.name, fn, spec.args)


def _check_batch(fns, prompts, completions, columns, completion_ids, combination) -> None:
    n = len(completions)
    if combination not in COMBINATIONS:
        raise UserError(f"reward combination {combination!r} is unknown", where="algorithm.reward_combination",
                        valid=", ".join(COMBINATIONS))
    lengths = {"prompts": len(prompts), **{k: len(v) for k, v in columns.items()}}
    if completion_ids is not None:
        lengths["completion_ids"] = len(completion_ids)
    for key, size in lengths.items():
        if size != n:
            raise UserError(f"{key} has {size} rows for {n} completions", where="reward batch",
                            valid="one value per completion (prompts repeated for each completion)")
    clash = sorted(set(columns) & set(RESERVED))
    if clash:
        raise UserError(f"dataset column(s) {clash} take names the reward call uses itself", where="dataset",
                        valid=f"column names other than {', '.join(RESERVED)}", hint="rename the column")
    names = Counter(rf.name for rf in fns)
    if any(c > 1 for c in names.values()):
        raise UserError(f"reward names repeat: {sorted(k for k, c in names.items() if c > 1)}",
                        valid="unique RewardFn.name (grpocli.rewards.resolve labels repeats name#2)")


def reward_kwargs(i, rf, prompts, completions, columns, completion_ids, context,
                  row: int | None = None) -> dict[str, Any]:
    """The keywords of reward ``i``'s call (of one row alone where ``row`` is given): copies of the
    batch's data (``fresh``), TRL's other keywords, the reward's args."""
    clash = sorted(set(rf.args) & set(columns))
    if clash:
        raise UserError(
            f"reward {rf.name!r} has arg {clash[0]!r} and the dataset has a column {clash[0]!r}: "
            "both would arrive as the same keyword",
            where=f"rewards[{i}].args.{clash[0]}",
            valid=f"args named unlike the columns ({', '.join(sorted(columns))})",
            hint="rename the arg (built-ins document an alternative name), or the column",
        )
    pick = (lambda v: fresh(v)) if row is None else (lambda v: fresh(v[row : row + 1]))
    kwargs: dict[str, Any] = {"prompts": pick(prompts), "completions": pick(completions)}
    kwargs.update({k: pick(v) for k, v in columns.items()})
    if completion_ids is not None:
        kwargs["completion_ids"] = pick(completion_ids)
    kwargs.update(context)
    kwargs.update(rf.args)
    return accepted_kwargs(rf.fn, kwargs, keep=set(rf.args))


def _rescorer(i, rf, prompts, completions, columns, completion_ids, context) -> Callable[[int, float | None], Any]:
    """Scores one row of the batch with reward ``i`` alone (what it logs is not the batch's)."""
    def rescore(row: int, timeout: float | None) -> Any:
        unlogged = RewardLog()
        quiet = {**context, "log_extra": unlogged.log_extra, "log_metric": unlogged.log_metric,
                 **keyword(rf.fn, ignored)}  # a row scored alone is timed by mask_rows
        return call_one(rf.fn, reward_kwargs(i, rf, prompts, completions, columns, completion_ids, quiet, row=row), timeout)

    return rescore


def check_values(i: int, rf: RewardFn, result: Any, n: int) -> list[float | None]:
    def bad(what: str) -> UserError:
        return UserError(f"reward {rf.name!r} returned {what}", where=f"rewards[{i}] ({rf.name})",
                         valid=VALID_VALUES, hint="fix the reward function's return value")

    if hasattr(result, "tolist") and hasattr(result, "ndim"):  # numpy array / torch tensor
        if result.ndim != 1:
            raise bad(f"an array of shape {tuple(getattr(result, 'shape', ()))}; expected ({n},)")
        result = result.tolist()
    if not isinstance(result, (list, tuple)):
        raise bad(f"{type(result).__name__} {short(result)}")
    if len(result) != n:
        raise bad(f"{len(result)} values for {n} completions")
    out: list[float | None] = []
    for row, value in enumerate(result):
        number = _number(value)
        if number is False:
            raise bad(f"{short(value)} ({type(value).__name__}) at row {row}")
        if number is not None and math.isinf(number) and not _is_float(value):  # 10**400: past float's range
            raise bad(f"{_magnitude(value)} ({type(value).__name__}) at row {row}, beyond +-{MAX_ABS_REWARD:g} "
                      "(too large for a float)")
        if number is not None and math.isinf(number):
            raise bad(f"{number} at row {row}; infinite rewards make every advantage NaN")
        if number is not None and abs(number) > MAX_ABS_REWARD:
            raise bad(f"{number:g} at row {row}, beyond +-{MAX_ABS_REWARD:g}: rewards are squared for their standard "
                      "deviation (in float32 for the advantages), which overflows")
        out.append(None if number is None or math.isnan(number) else number)
    return out


def _check_totals(fns: list[RewardFn], per_reward: dict[str, list[float | None]], total: list[float]) -> None:
    """The weighted sums stay finite and within +-MAX_ABS_REWARD (each reward does; its weight may not)."""
    for row, value in enumerate(total):
        if math.isfinite(value) and abs(value) <= MAX_ABS_REWARD:
            continue
        parts = ", ".join(f"{rf.name}: {rf.weight:g} x {per_reward[rf.name][row]}" for rf in fns)
        raise UserError(
            f"the weighted total reward of row {row} is {value:g} ({parts}), beyond +-{MAX_ABS_REWARD:g}: its "
            "standard deviation over the group overflows", where="rewards[].weight",
            valid=f"weights and rewards whose weighted sum stays within +-{MAX_ABS_REWARD:g}",
            hint="lower the weights of the large rewards (or scale the rewards themselves)",
        )


def _number(value: Any) -> float | None | Literal[False]:
    """The value as a float, None for None, False when it is no number."""
    if value is None:
        return None
    if not isinstance(value, (bool, numbers.Real)) and hasattr(value, "item"):  # numpy / torch scalar
        try:
            value = value.item()
        except (TypeError, ValueError):
            return False
    if isinstance(value, (bool, numbers.Real)):
        try:
            return float(value)
        except OverflowError:  # an int (or Fraction) past float's range: infinite, said as such by the caller
            return math.inf if value > 0 else -math.inf
    return False


def _is_float(value: Any) -> bool:
    """Whether ``value`` is a float in itself (a Python, numpy or torch one), not a number made one."""
    return isinstance(value, float) or "float" in type(value).__name__.lower()


def _magnitude(value: Any) -> str:
    """A number too large to print whole (Python refuses str() past 4300 digits): its size."""
    sign = "a negative" if value < 0 else "a positive"
    if isinstance(value, int):
        return f"{sign} integer of about {int(abs(value).bit_length() * math.log10(2)) + 1} digits"
    return f"{sign} number past 1e308"
