"""What crosses the sandbox's edge (case_values) and how assert tests are taken apart (assertions): the
expected value stays with the trainer, and nothing evaluated where the solution runs compares with it."""

from __future__ import annotations

import pytest

from grpocli.rewards import case_values
from grpocli.rewards.assertions import Check, free_names, take_apart


def test_plain_values_cross_and_nothing_else():
    value = {(1, "a"): {1, 2}, "b": b"\x00x", "c": 1 + 2j, "n": None, "t": (True, [2.5, frozenset([3])])}
    assert case_values.loads(case_values.dumps(value)) == value
    assert type(case_values.loads(case_values.dumps((1,)))) is tuple
    assert case_values.loads(case_values.dumps([1, 1.0])) == [1, 1.0]
    assert [type(v) for v in case_values.loads(case_values.dumps([1, 1.0, True]))] == [int, float, bool]

    class Equal(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    for bad in (Equal(3), [Equal(3)], object(), iter([1]), {"k": lambda: 1}):
        with pytest.raises(case_values.NotPlain):
            case_values.encode(bad)
    nested: list = []
    for _ in range(200):
        nested = [nested]
    with pytest.raises(case_values.NotPlain, match="nested"):
        case_values.encode(nested)
    for text in ('{"eval": "x"}', '{"tuple": 1}', '{"dict": [[[1], 2]]}', "[" * 5000 + "]" * 5000, "nope", "9" * 5000):
        with pytest.raises(ValueError):
            case_values.loads(text)


def test_asserts_of_a_call_and_a_literal_are_taken_apart():
    requests, checks = take_apart("import math\nassert add(1, 2) == 3\nassert (4, 5) == pair(1)")
    assert requests == [["exec", "import math"], ["eval", "add(1, 2)"], ["eval", "pair(1)"]]
    assert checks == [None, Check("eq", 3), Check("eq", (4, 5))]
    assert take_apart("assert set(f([1, 2])) == set([2, 1])")[1] == [Check("eq", {1, 2})]
    assert take_apart("assert Solution().two([2, 7], 9) == [0, 1]")[0] == [["eval", "Solution().two([2, 7], 9)"]]
    assert take_apart("assert f(1) is None")[1] == [Check("is", None)]
    assert take_apart("assert not is_prime(8)")[1] == [Check("falsy")]
    assert take_apart("assert f(x=-1.5) != float('inf')")[1] == [Check("ne", float("inf"))]
    close = take_apart("import math\nassert math.isclose(area(2), 12.566, rel_tol=0.001)")[1][1]
    assert close == Check("close", 12.566, rel_tol=0.001) and close.holds(12.5664) and not close.holds("12.566")
    near = take_apart("assert abs(area(2) - 12.566) < 1e-3")[1][0]
    assert near.holds(12.5661) and not near.holds(12.6) and not near.holds(True)


@pytest.mark.parametrize("tests", [
    "assert (f(1) == 3) == True",            # the comparison would happen where the solution runs
    "import operator\nassert operator.eq(f(1), 3)",
    "from operator import eq\nassert eq(f(1), 3)",
    "assert f(1).__eq__(3)",
    "assert getattr(f(1), 'real') == 3",
    "assert f(1) in [3, 4]",
    "assert f(1) == g(1)",                   # no literal on either side
    "assert f(lambda x: x == 3) == 1",
    "def check(candidate):\n    assert candidate(1) == 3\ncheck(f)",
    "x = 1\nassert f(x) == 2",
    "assert f(1) == 3 and f(2) == 4",
    "assert f(1",
])
def test_other_test_code_goes_to_the_judge(tests):
    assert take_apart(tests) is None


def test_the_judge_stands_in_for_the_names_the_tests_do_not_define():
    code = ("import math\nMETA = {}\ndef check(candidate):\n    for i in range(3):\n        assert candidate(i) == helper(i)\n"
            "    try:\n        candidate(-1)\n    except ValueError as err:\n        print(err)\ncheck(solve)\n")
    assert free_names(code) == ["helper", "solve"]


def test_checks_compare_the_trainers_own_values():
    assert Check("eq", 3).holds(3.0) and not Check("eq", [1, 2]).holds((1, 2))  # Python's ==, on builtins
    assert Check("json", [[1, 2]]).holds((1, 2)) and Check("json", {"1": 2}).holds({1: 2})
    assert Check("is", True).holds(True) and not Check("is", True).holds(1)
    assert Check("truthy").holds([0]) and Check("falsy").holds("")
