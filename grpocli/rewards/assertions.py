"""Assert tests taken apart, so that the solution's process never sees what is expected.

``assert add(1, 2) == 3`` becomes the expression ``add(1, 2)``, which the solution's process evaluates
and sends back as plain data (``case_values``), and the expected value 3, which stays here and is
compared here. The forms taken apart (one or more asserts, after ``import`` lines):

- ``assert E == V``, ``V == E``, ``E != V``: V a literal (``ast.literal_eval``), or ``set(...)``,
  ``frozenset``, ``tuple``, ``list``, ``dict``, ``float('inf')`` and the like of literals;
- ``assert E is None`` / ``True`` / ``False`` (and ``is not``), ``assert E``, ``assert not E``;
- ``assert math.isclose(E, V, rel_tol=..., abs_tol=...)`` (or ``isclose`` imported from math), and
  ``assert abs(E - V) < T`` (or ``<=``).

E must be what cannot compare with anything expected: calls of the solution's functions (or of
``sorted``, ``set``, ``len`` and other plain builtins), names, attributes (no dunders), subscripts,
arithmetic and literal arguments; no comparison, no ``and``/``or``, no lambda, no call of a builtin
like ``getattr`` or of something the tests imported. Any other test code returns None here and is
run by a judge process instead (``sandbox_judge``).
"""

from __future__ import annotations

import ast
import builtins
import math
from dataclasses import dataclass
from typing import Any, Literal

PLAIN_CALLS = frozenset({"sorted", "set", "frozenset", "list", "tuple", "len", "round", "abs", "str", "int", "float",
                         "bool", "sum", "min", "max", "dict", "reversed"})
CONSTRUCTORS = {"set": set, "frozenset": frozenset, "tuple": tuple, "list": list, "dict": dict, "float": float,
                "complex": complex, "int": int, "str": str, "bytes": bytes}
SAFE_NODES = (ast.Call, ast.Name, ast.Attribute, ast.Subscript, ast.Slice, ast.Constant, ast.List, ast.Tuple, ast.Set,
              ast.Dict, ast.UnaryOp, ast.BinOp, ast.keyword, ast.Starred, ast.expr_context, ast.operator, ast.unaryop)
BUILTINS = frozenset(dir(builtins))
MISSING = object()


@dataclass(frozen=True)
class Check:
    """What one evaluated expression must be."""

    kind: Literal["eq", "ne", "is", "is_not", "truthy", "falsy", "close", "json"]
    expected: Any = None
    rel_tol: float = 1e-9
    abs_tol: float = 0.0
    strict: bool = False  # close by ``abs(E - V) < T``: strictly below

    def holds(self, got: Any) -> bool:
        """Whether ``got`` (a plain value the trainer decoded) passes; Python's own ``==`` on builtin objects."""
        if self.kind == "eq":
            return bool(got == self.expected)
        if self.kind == "ne":
            return bool(got != self.expected)
        if self.kind == "is":
            return got is self.expected
        if self.kind == "is_not":
            return got is not self.expected
        if self.kind in ("truthy", "falsy"):
            return bool(got) == (self.kind == "truthy")
        if self.kind == "json":  # fn_name cases: the answer as JSON would write it, or that in a list
            return as_json(got) == self.expected or [as_json(got)] == self.expected
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            return False
        if self.strict:
            return abs(got - self.expected) < self.abs_tol
        return math.isclose(got, self.expected, rel_tol=self.rel_tol, abs_tol=self.abs_tol)


def as_json(value: Any) -> Any:
    """Tuples as lists and dict keys as strings, as a JSON round trip makes them."""
    if isinstance(value, (list, tuple)):
        return [as_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): as_json(v) for k, v in value.items()}
    return value


def take_apart(tests: str) -> tuple[list[list], list[Check | None]] | None:
    """(requests for the solution's process, the check of each one's answer: None for an import) when
    every statement of ``tests`` is an import or an assert of the forms above; else None."""
    try:
        tree = ast.parse(tests)
    except SyntaxError:
        return None
    requests: list[list] = []
    checks: list[Check | None] = []
    imported: set[str] = set()
    for statement in tree.body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            requests.append(["exec", ast.unparse(statement)])
            checks.append(None)
            imported |= {(a.asname or a.name).split(".")[0] for a in statement.names}
            continue
        if isinstance(statement, ast.Pass):
            continue
        if not isinstance(statement, ast.Assert):
            return None
        taken = _assertion(statement.test, imported, tree)
        if taken is None:
            return None
        requests.append(["eval", ast.unparse(taken[0])])
        checks.append(taken[1])
    return (requests, checks) if any(checks) else None


def _assertion(test: ast.expr, imported: set[str], tree: ast.Module) -> tuple[ast.expr, Check] | None:
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        return _comparison(test.left, test.ops[0], test.comparators[0], imported)
    if isinstance(test, ast.Call) and _is_isclose(test.func, imported, tree):
        return _isclose(test, imported)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and _safe(test.operand, imported):
        return test.operand, Check("falsy")
    if _safe(test, imported):
        return test, Check("truthy")
    return None


def _comparison(left: ast.expr, op: ast.cmpop, right: ast.expr, imported: set[str]) -> tuple[ast.expr, Check] | None:
    if isinstance(op, (ast.Eq, ast.NotEq)):
        for expr, other in ((left, right), (right, left)):
            value = _literal(other)
            if value is not MISSING and _safe(expr, imported):
                return expr, Check("eq" if isinstance(op, ast.Eq) else "ne", value)
        return None
    if isinstance(op, (ast.Is, ast.IsNot)) and isinstance(right, ast.Constant) and right.value in (None, True, False) \
            and type(right.value) in (type(None), bool) and _safe(left, imported):
        return left, Check("is" if isinstance(op, ast.Is) else "is_not", right.value)
    if isinstance(op, (ast.Lt, ast.LtE)) and isinstance(left, ast.Call) and isinstance(left.func, ast.Name) \
            and left.func.id == "abs" and "abs" not in imported and len(left.args) == 1 and not left.keywords \
            and isinstance(left.args[0], ast.BinOp) and isinstance(left.args[0].op, ast.Sub):
        tolerance, a, b = _literal(right), left.args[0].left, left.args[0].right
        for expr, other in ((a, b), (b, a)):
            value = _literal(other)
            if _number(value) and _number(tolerance) and _safe(expr, imported):
                return expr, Check("close", value, rel_tol=0.0, abs_tol=tolerance, strict=isinstance(op, ast.Lt))
    return None


def _is_isclose(func: ast.expr, imported: set[str], tree: ast.Module) -> bool:
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return func.attr == "isclose" and func.value.id == "math" and "math" in imported
    if not (isinstance(func, ast.Name) and func.id == "isclose"):
        return False
    return any(isinstance(s, ast.ImportFrom) and s.module == "math" and any(a.name == "isclose" and a.asname is None
                                                                               for a in s.names) for s in tree.body)


def _isclose(call: ast.Call, imported: set[str]) -> tuple[ast.expr, Check] | None:
    if len(call.args) != 2 or any(k.arg not in ("rel_tol", "abs_tol") for k in call.keywords):
        return None
    tolerances = {k.arg: _literal(k.value) for k in call.keywords}
    if not all(_number(v) for v in tolerances.values()):
        return None
    for expr, other in ((call.args[0], call.args[1]), (call.args[1], call.args[0])):
        value = _literal(other)
        if _number(value) and _safe(expr, imported):
            return expr, Check("close", value, rel_tol=tolerances.get("rel_tol", 1e-9),
                               abs_tol=tolerances.get("abs_tol", 0.0))
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _literal(node: ast.expr) -> Any:
    """The value of a literal (or of a constructor of literals: ``set([1, 2])``, ``float('inf')``), else MISSING."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CONSTRUCTORS \
            and not node.keywords and len(node.args) <= 1:
        args = [_literal(a) for a in node.args]
        if all(a is not MISSING for a in args):
            try:
                return CONSTRUCTORS[node.func.id](*args)
            except (ValueError, TypeError, OverflowError):
                return MISSING
    return MISSING


def _safe(expr: ast.expr, imported: set[str]) -> bool:
    """Whether ``expr`` can be evaluated where the solution runs without comparing anything there."""
    for node in ast.walk(expr):
        if not isinstance(node, SAFE_NODES):
            return False
        if isinstance(node, ast.Attribute) and node.attr.startswith("__"):
            return False
        if isinstance(node, ast.Call):
            callee = node.func
            while isinstance(callee, (ast.Attribute, ast.Subscript, ast.Call)):
                callee = callee.value if not isinstance(callee, ast.Call) else callee.func
            if not isinstance(callee, ast.Name) or callee.id in imported:
                return False
            if isinstance(node.func, ast.Name) and node.func.id in BUILTINS and node.func.id not in PLAIN_CALLS:
                return False
    return True


def free_names(tests: str) -> list[str]:
    """Names the test code reads but never binds and that are not builtins: the solution's, to stand in for."""
    try:
        tree = ast.parse(tests)
    except SyntaxError:
        return []
    loaded, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
    return sorted(loaded - bound - BUILTINS)
