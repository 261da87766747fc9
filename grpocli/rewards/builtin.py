"""Built-in rewards, registered through the same hook as third-party plugins.

Every function has TRL's reward contract ``fn(prompts, completions, **kwargs) -> list[float |
None]``: dataset columns arrive by name (one value per completion) together with the recipe's
``[[rewards]] args``; unknown keywords are ignored. The args of a built-in are its named
keyword parameters; the columns it reads come through ``**kwargs``, so that a recipe arg
named like a column is refused (``grpocli.rewards.arguments``) instead of taken for one.
Light imports only: math-verify is imported where it is used.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import grpocli
from grpocli.errors import UserError
from grpocli.rewards.code_tests import code_tests
from grpocli.rewards.expression import parse_expression
from grpocli.rewards.judge import judge
from grpocli.rewards.text import (
    answer_tag,
    completion_text,
    last_boxed,
    last_integer,
    last_line,
)
from grpocli.rewards.timings import RowClock

STRICT_FORMAT = re.compile(r"<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>", re.DOTALL)
SOFT_FORMAT = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)  # read by soft_format()
SOFT_JOINT = re.compile(r"</think>\s*<answer>")
STEP_MARKERS = re.compile(r"(Step \d+:|^\d+\.|\n-|\n\*|First,|Second,|Next,|Finally,)", re.MULTILINE)
TAGS = ("<think>", "</think>", "<answer>", "</answer>")
MATH_VERIFY_TIMEOUT_S = 5


def format_strict(prompts: list, completions: list, **kwargs: Any) -> list[float]:
    """1.0 when the completion is exactly <think>\\n...\\n</think>\\n<answer>\\n...\\n</answer> (DeepSeek-R1)."""
    out = []
    for c in completions:
        text = completion_text(c)
        once = all(text.count(tag) == 1 for tag in TAGS)
        out.append(1.0 if once and STRICT_FORMAT.fullmatch(text) else 0.0)
    return out


def format_soft(prompts: list, completions: list, **kwargs: Any) -> list[float]:
    """1.0 when <think>...</think> is followed by <answer>...</answer> anywhere (TRL's soft format)."""
    return [1.0 if soft_format(completion_text(c)) else 0.0 for c in completions]


def soft_format(text: str) -> bool:
    """Whether ``SOFT_FORMAT.search(text)`` finds a match, in linear time (the expression retries from
    every unclosed <think>: 35 KB of them took 4 s): the first <think>, the first </think><answer>
    after it, a </answer> after that."""
    opened = text.find("<think>")
    joint = SOFT_JOINT.search(text, opened + len("<think>")) if opened != -1 else None
    return joint is not None and text.find("</answer>", joint.end()) != -1


def format_answer_tag(prompts: list, completions: list, **kwargs: Any) -> list[float]:
    """1.0 when the completion holds exactly one <answer>...</answer>."""
    out = []
    for c in completions:
        text = completion_text(c)
        once = text.count("<answer>") == 1 and text.count("</answer>") == 1
        out.append(1.0 if once and answer_tag(text) is not None else 0.0)
    return out


def format_tag_count(prompts: list, completions: list, **kwargs: Any) -> list[float]:
    """0.25 for each of <think>\\n, \\n</think>\\n, \\n<answer>\\n, \\n</answer> found exactly once (open-r1's
    tag_count_reward): partial credit on the way to format.strict."""
    marks = ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>")
    return [sum(0.25 for m in marks if completion_text(c).count(m) == 1) for c in completions]


def reasoning_steps(prompts: list, completions: list, min_steps: int = 3, **kwargs: Any) -> list[float]:
    """Share of min_steps step markers found ('Step 1:', '1.', bullets, 'First,'), capped at 1 (open-r1)."""
    if min_steps < 1:
        raise UserError(f"min_steps must be >= 1, got {min_steps!r}", valid="an integer >= 1")
    return [min(1.0, len(STEP_MARKERS.findall(completion_text(c))) / min_steps) for c in completions]


def length(
    prompts: list,
    completions: list,
    target: Any = 20,
    normalize: bool = True,
    target_length: int | None = None,
    **kwargs: Any,
) -> list[float]:
    """-|target - characters| (TRL's reward_len example); divided by target when normalize.

    ``target_length`` is the same arg under a name that no dataset column (such as
    Countdown's ``target``) can take.
    """
    if target_length is not None:
        target = target_length
    elif isinstance(target, (list, tuple)):
        raise UserError(
            "reward 'length' received the dataset column 'target' as its target length",
            valid="args.target_length = <characters> when the dataset has a 'target' column",
            hint="set args.target_length in this [[rewards]] entry",
        )
    if normalize and target <= 0:
        raise UserError(f"target must be > 0 when normalize = true, got {target!r}", valid="target >= 1")
    scale = float(target) if normalize else 1.0
    return [-abs(target - len(completion_text(c))) / scale for c in completions]


def arithmetic_exact(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
    """1.0 when the last integer of the completion (inside <answer> if present) equals the answer column."""
    answer = kwargs.get("answer")
    if answer is None:
        raise _missing_column("arithmetic.exact", "answer", kwargs)
    out: list[float | None] = []
    for c, gold in zip(completions, answer):
        try:
            expected = int(str(gold).strip())
        except ValueError:
            out.append(None)  # the row has no integer answer: the reward does not apply
            continue
        text = completion_text(c)
        tagged = answer_tag(text)
        out.append(1.0 if last_integer(text if tagged is None else tagged) == expected else 0.0)
    return out


def countdown_equation(
    prompts: list,
    completions: list,
    format_score: float = 0.1,
    **kwargs: Any,
) -> list[float]:
    """Countdown (TinyZero): 1.0 for an equation using each of nums once that equals target.

    Reads the columns ``nums`` and ``target``. The answer is the <answer> content, else the
    last line. An equation that uses the numbers correctly but misses the target scores
    ``format_score``; anything else scores 0.0.
    """
    nums, target = kwargs.get("nums"), kwargs.get("target")
    if nums is None or target is None:
        raise _missing_column("countdown.equation", "nums" if nums is None else "target", kwargs)
    out = []
    for c, numbers, goal in zip(completions, nums, target):
        text = completion_text(c)
        tagged = answer_tag(text)
        expr = parse_expression(last_line(text) if tagged is None else tagged)
        if expr is None or sorted(expr.numbers) != sorted(int(n) for n in numbers):
            out.append(0.0)
            continue
        value = expr.value()
        out.append(1.0 if value is not None and value == int(goal) else float(format_score))
    return out


def math_accuracy(
    prompts: list, completions: list, answer_column: str = "answer", **kwargs: Any
) -> list[float | None]:
    """1.0 when the answer equals the gold under math-verify (TRL's accuracy_reward); None if gold does not parse.

    The answer is the <answer> content, else the last \\boxed{}, else the whole completion.
    Gold comes from column ``answer_column`` (or ``solution``, TRL's name).
    """
    golds = kwargs.get(answer_column)
    if golds is None and answer_column == "answer":
        golds = kwargs.get("solution")
    if golds is None:
        raise _missing_column("math.accuracy", answer_column, kwargs, hint_arg="answer_column")
    from math_verify import parse, verify

    # math-verify times out with signal.alarm, which works only in the main thread.
    seconds = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    parsed_golds: dict[str, list] = {}
    out: list[float | None] = []
    clock = RowClock(len(completions), kwargs)  # each answer's seconds (grpocli.rewards.timings)
    for row, (c, gold) in enumerate(zip(completions, golds)):
        with clock.row(row):
            out.append(_math_score(parse, verify, parsed_golds, str(gold), c, seconds))
    clock.report()
    return out


def _math_score(parse: Callable[..., list], verify: Callable[..., bool], parsed_golds: dict[str, list], key: str,
                c: Any, seconds: int | None) -> float | None:
    """One answer's math.accuracy (its gold parsed once per batch, in ``parsed_golds``)."""
    if key not in parsed_golds:
        parsed_golds[key] = _parse_gold(parse, key, seconds)
    if not parsed_golds[key]:
        return None
    text = completion_text(c)
    tagged, boxed = answer_tag(text), last_boxed(text)
    pred = tagged if tagged is not None else (f"\\boxed{{{boxed}}}" if boxed is not None else text)
    try:
        answer = parse(pred, parsing_timeout=seconds)
        return float(verify(parsed_golds[key], answer, timeout_seconds=seconds))
    except Exception:  # math-verify's own failures on odd input count as wrong
        return 0.0


math_accuracy.bounds_own_time = True  # math-verify's per-answer alarms need the main thread (invocation)
math_accuracy.takes_row_seconds = True  # reports each answer's seconds (grpocli.rewards.timings)
#: The columns each reads through **kwargs, one of each tuple (grpocli.rewards.arguments.check_columns_read).
arithmetic_exact.reads_columns = lambda args: [("answer",)]
countdown_equation.reads_columns = lambda args: [("nums",), ("target",)]
math_accuracy.reads_columns = lambda args: [(args.get("answer_column", "answer"),) + (
    ("solution",) if args.get("answer_column", "answer") == "answer" else ())]


def _parse_gold(parse: Callable[..., list], gold: str, seconds: int | None) -> list:
    """Gold as written, else as LaTeX math ('x^2+1' parses only inside $...$); plain words
    are never wrapped, since math-verify would read them as products of symbols."""
    candidates = [gold]
    if any(ch in gold for ch in "\\^_{}=+-*/0123456789"):
        candidates.append(f"${gold}$")
    for candidate in candidates:
        try:
            parsed = parse(candidate, parsing_timeout=seconds)
        except Exception:
            parsed = []
        if parsed:
            return parsed
    return []


def _missing_column(reward: str, column: str, kwargs: dict, hint_arg: str | None = None) -> UserError:
    present = ", ".join(sorted(kwargs)) or "(none)"
    hint = f"set args.{hint_arg} in this [[rewards]] entry, or " if hint_arg else ""
    return UserError(
        f"reward {reward!r} needs a dataset column {column!r}, which the batch does not have",
        valid=f"columns and args present: {present}",
        hint=f"{hint}use a dataset with that column (`grpo inspect plugins` lists datasets)",
    )


BUILTIN_REWARDS: dict[str, Callable[..., list]] = {
    "format.strict": format_strict,
    "format.soft": format_soft,
    "format.answer_tag": format_answer_tag,
    "format.tag_count": format_tag_count,
    "reasoning.steps": reasoning_steps,
    "length": length,
    "arithmetic.exact": arithmetic_exact,
    "countdown.equation": countdown_equation,
    "math.accuracy": math_accuracy,
    "code.tests": code_tests,
    "judge": judge,
}


@grpocli.hookimpl
def register_rewards(register: Callable[..., None]) -> None:
    """Register the built-in rewards under their namespaced names."""
    for name, fn in BUILTIN_REWARDS.items():
        register(name, fn, description=(fn.__doc__ or "").strip().split("\n", 1)[0])
