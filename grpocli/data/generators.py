"""Procedural datasets: seeded, offline, made in milliseconds. Pure Python (no `datasets`).

``arithmetic``: short sums such as ``12+7=`` with an integer ``answer`` -- small enough for a
tiny character-level model to learn in minutes (the quickstart). ``style = "question"`` words the
same problems as an instruct model reads them, ``What is 12 + 7?``; the problems, answers and
held-out splits do not depend on the style.

``countdown``: the Countdown number game as TinyZero (Jiayi-Pan/TinyZero,
examples/data_preprocess/countdown.py) poses it: reach ``target`` with every number of ``nums``
used exactly once and + - * /. Unlike TinyZero's generator (random numbers and target, not
always solvable) every instance here is built from a random expression over its numbers, so a
solution exists and is kept in the ``solution`` column.

Held-out splits: every problem belongs to one side by a hash of its content (one in
``HELD_OUT_EVERY`` goes to the ``HELD_OUT_SPLITS``: test, validation, valid, eval, dev), so a
``test`` split never repeats a ``train`` problem whatever the seeds; the split name also enters
the seed, so streams differ.
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Callable
from typing import Any

from grpocli.errors import UserError

HELD_OUT_SPLITS = frozenset({"test", "validation", "valid", "eval", "dev"})
HELD_OUT_EVERY = 10
MAX_TRIES_PER_SAMPLE = 1000

COUNTDOWN_PROMPT = (
    "Using the numbers {nums}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work "
    "in <think> </think> tags. And return the final answer in <answer> </answer> tags, for "
    "example <answer> (1 + 2) / 3 </answer>."
)


#: How ``arithmetic`` words a problem: ``{expression}`` is its terms and signs joined by ``joiner``.
ARITHMETIC_STYLES = {
    "equation": ("{expression}=", ""),  # "12+7=": the quickstart's tiny character-level model
    "question": ("What is {expression}?", " "),  # "What is 12 + 7?": an instruct model
}


def arithmetic(
    split: str,
    seed: int,
    *,
    num_samples: int = 2000,
    min_value: int = 0,
    max_value: int = 99,
    ops: str = "+-",
    num_terms: int = 2,
    style: str = "equation",
) -> list[dict[str, Any]]:
    """Rows ``{"prompt": "12+7=", "answer": 19}`` (``style = "question"``: ``"What is 12 + 7?"``);
    ``*`` binds tighter than ``+``/``-``."""
    _check(num_samples >= 1, "num_samples", num_samples, "an integer >= 1")
    _check(0 <= min_value <= max_value, "max_value", max_value, "an integer >= min_value >= 0")
    _check(bool(ops) and set(ops) <= set("+-*"), "ops", ops, 'a string of "+", "-", "*"')
    _check(2 <= num_terms <= 8, "num_terms", num_terms, "an integer from 2 to 8")
    _check(style in ARITHMETIC_STYLES, "style", style, " or ".join(map(repr, ARITHMETIC_STYLES)))
    wording, joiner = ARITHMETIC_STYLES[style]
    rng = random.Random(f"arithmetic:{seed}:{split}")

    def draw() -> dict[str, Any]:
        terms = [rng.randint(min_value, max_value) for _ in range(num_terms)]
        signs = [rng.choice(ops) for _ in range(num_terms - 1)]
        text = str(terms[0]) + "".join(f"{joiner}{s}{joiner}{t}" for s, t in zip(signs, terms[1:]))
        return {"prompt": wording.format(expression=text), "answer": _value(terms, signs)}

    # The split key is the problem in the equation style ("12+7="), whatever the wording.
    key = lambda row: re.sub(r"[^0-9+*-]", "", row["prompt"]) + "="  # noqa: E731
    return _sample(draw, split, num_samples, key=key)


def countdown(
    split: str,
    seed: int,
    *,
    num_samples: int = 2000,
    num_numbers: int | list[int] = (3, 4),
    max_number: int = 99,
    max_target: int = 100,
) -> list[dict[str, Any]]:
    """Rows ``{"prompt", "nums", "target", "solution"}``, each solvable with every number once.

    ``num_numbers`` is a count or a ``[low, high]`` range; numbers are drawn from 1..max_number,
    targets lie in 1..max_target and every intermediate result is a positive integer.
    """
    low, high = (num_numbers, num_numbers) if isinstance(num_numbers, int) else tuple(num_numbers)
    _check(2 <= low <= high <= 6, "num_numbers", num_numbers, "a count from 2 to 6, or [low, high]")
    _check(num_samples >= 1, "num_samples", num_samples, "an integer >= 1")
    _check(max_number >= 1, "max_number", max_number, "an integer >= 1")
    _check(max_target >= 1, "max_target", max_target, "an integer >= 1")
    rng = random.Random(f"countdown:{seed}:{split}")

    def draw() -> dict[str, Any] | None:
        count = rng.randint(low, high)  # fixed before retrying, so counts stay evenly spread
        for _ in range(MAX_TRIES_PER_SAMPLE):
            nums = [rng.randint(1, max_number) for _ in range(count)]
            target, solution = _random_equation(rng, nums)
            if 1 <= target <= max_target:
                prompt = COUNTDOWN_PROMPT.format(nums=nums, target=target)
                return {"prompt": prompt, "nums": nums, "target": target, "solution": solution}
        return None

    key = lambda row: f"{sorted(row['nums'])}:{row['target']}"  # noqa: E731
    return _sample(draw, split, num_samples, key=key)


def _random_equation(rng: random.Random, nums: list[int]) -> tuple[int, str]:
    """Combine the numbers pairwise at random until one remains: (value, expression).

    Subtraction takes the larger minus the smaller and division is kept only where exact, so
    every intermediate value is a positive integer (a solution a model can write down).
    """
    items = [(n, str(n)) for n in nums]
    while len(items) > 1:
        (a, ea), (b, eb) = [items.pop(rng.randrange(len(items))) for _ in range(2)]
        if a < b:
            (a, ea), (b, eb) = (b, eb), (a, ea)
        choices = ["+", "*"] + (["-"] if a > b else []) + (["/"] if a % b == 0 and b > 1 else [])
        op = rng.choice(choices)
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
        items.append((value, f"({ea} {op} {eb})"))
    value, expr = items[0]
    return value, expr[1:-1] if expr.startswith("(") else expr


def _value(terms: list[int], signs: list[str]) -> int:
    """Evaluate ``t0 s0 t1 s1 t2 ...`` with ``*`` before ``+``/``-`` (left to right)."""
    products, product_signs = [terms[0]], []
    for sign, term in zip(signs, terms[1:]):
        if sign == "*":
            products[-1] *= term
        else:
            products.append(term)
            product_signs.append(sign)
    total = products[0]
    for sign, term in zip(product_signs, products[1:]):
        total = total + term if sign == "+" else total - term
    return total


def _sample(
    draw: Callable[[], dict[str, Any] | None],
    split: str,
    num_samples: int,
    key: Callable[[dict[str, Any]], str],
) -> list[dict[str, Any]]:
    """``num_samples`` rows from ``draw`` that belong to ``split``'s side of the hash partition."""
    held_out = split in HELD_OUT_SPLITS
    rows: list[dict[str, Any]] = []
    tries = 0
    while len(rows) < num_samples:
        tries += 1
        if tries > MAX_TRIES_PER_SAMPLE * num_samples:
            raise UserError(
                f"could draw only {len(rows)} of {num_samples} problems for split {split!r}: "
                "the problem space of these arguments is too small",
                where="data.args",
                valid="a wider range (max_value, max_number, max_target) or more terms",
            )
        row = draw()
        if row is not None and _is_held_out(key(row)) == held_out:
            rows.append(row)
    return rows


def _is_held_out(key: str) -> bool:
    return zlib.crc32(key.encode()) % HELD_OUT_EVERY == 0


def _check(ok: bool, arg: str, value: object, valid: str) -> None:
    if not ok:
        raise UserError(f"{arg} = {value!r} is out of range", where=f"data.args.{arg}", valid=valid)
