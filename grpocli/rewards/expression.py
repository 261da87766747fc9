"""Safe arithmetic: parse an expression of integers, + - * / and parentheses, and evaluate it.

Used by the Countdown reward (TinyZero's ``countdown.compute_score``), which evaluates the
model's equation with ``eval`` after a character whitelist; here the expression goes through
``ast`` and only the nodes below are evaluated, in exact fractions, so nothing else can run.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from fractions import Fraction

MAX_CHARS = 512  # deeper nesting than this is no Countdown answer (and guards the parser)
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


@dataclass(frozen=True)
class Expression:
    """A parsed arithmetic expression: its tree and the integers it uses, in order."""

    tree: ast.expr
    numbers: tuple[int, ...]

    def value(self) -> Fraction | None:
        """The exact value, or None where it divides by zero."""
        try:
            return _evaluate(self.tree)
        except ZeroDivisionError:
            return None


def parse_expression(text: str) -> Expression | None:
    """Parse ``text`` as integers joined by + - * / with parentheses; None for anything else.

    A trailing ``= <number>`` (as in ``(1 + 2) * 3 = 9``) is dropped. No unary minus, no
    decimals, no names, calls or other operators.
    """
    text = text.strip()
    if "=" in text:
        left, _, right = text.partition("=")
        if not right.strip().lstrip("-").isdigit():
            return None
        text = left.strip()
    if not text or len(text) > MAX_CHARS:
        return None
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    numbers: list[int] = []
    if not _collect(tree, numbers):
        return None
    return Expression(tree, tuple(numbers))


def _collect(node: ast.AST, numbers: list[int]) -> bool:
    """True when ``node`` holds only allowed nodes; appends its integers to ``numbers``."""
    if isinstance(node, ast.Constant):
        if type(node.value) is not int or node.value < 0:
            return False
        numbers.append(node.value)
        return True
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return _collect(node.left, numbers) and _collect(node.right, numbers)
    return False


def _evaluate(node: ast.expr) -> Fraction:
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    assert isinstance(node, ast.BinOp)
    return OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
