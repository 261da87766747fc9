"""Procedural datasets: deterministic by seed, correct answers, solvable Countdown, held-out splits."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest

from grpocli.data import generators
from grpocli.errors import UserError


def _eval_exact(expression: str) -> Fraction:
    """Evaluate + - * / ( ) over integers exactly (test oracle, independent of the generator)."""
    assert re.fullmatch(r"[\d+\-*/() ]+", expression), expression
    return eval(re.sub(r"(\d+)", r"Fraction(\1)", expression), {"Fraction": Fraction})


def test_arithmetic_is_deterministic_by_seed_and_split():
    a = generators.arithmetic("train", 0, num_samples=50)
    assert a == generators.arithmetic("train", 0, num_samples=50)
    assert a != generators.arithmetic("train", 1, num_samples=50)
    assert a != generators.arithmetic("test", 0, num_samples=50)


@pytest.mark.parametrize("ops,num_terms", [("+-", 2), ("*", 2), ("+-*", 4)])
def test_arithmetic_answers_are_right(ops, num_terms):
    rows = generators.arithmetic("train", 3, num_samples=300, ops=ops, num_terms=num_terms)
    for row in rows:
        assert row["prompt"].endswith("=")
        expression = row["prompt"][:-1]
        assert set(re.findall(r"[+\-*]", expression)) <= set(ops)
        assert len(re.findall(r"\d+", expression)) == num_terms
        assert row["answer"] == _eval_exact(expression), row


def test_arithmetic_respects_value_range():
    rows = generators.arithmetic("train", 0, num_samples=200, min_value=5, max_value=9)
    values = {int(v) for row in rows for v in re.findall(r"\d+", row["prompt"])}
    assert values <= set(range(5, 10)) and len(values) > 1


def test_train_and_test_problems_never_overlap():
    train = {r["prompt"] for r in generators.arithmetic("train", 0, num_samples=2000)}
    test = {r["prompt"] for r in generators.arithmetic("test", 0, num_samples=500)}
    assert len(test) > 400 and not train & test
    keys = lambda rows: {(tuple(sorted(r["nums"])), r["target"]) for r in rows}  # noqa: E731
    assert not keys(generators.countdown("train", 0, num_samples=500)) & keys(
        generators.countdown("test", 0, num_samples=200)
    )


def test_countdown_solution_reaches_target_using_each_number_once():
    rows = generators.countdown("train", 7, num_samples=500, num_numbers=[3, 4], max_target=100)
    assert {len(r["nums"]) for r in rows} == {3, 4}
    for row in rows:
        used = sorted(int(n) for n in re.findall(r"\d+", row["solution"]))
        assert used == sorted(row["nums"]), row
        assert _eval_exact(row["solution"]) == row["target"], row
        assert 1 <= row["target"] <= 100
        assert all(1 <= n <= 99 for n in row["nums"])
        task = f"Using the numbers {row['nums']}, create an equation that equals {row['target']}."
        assert row["prompt"].startswith(task)


def test_countdown_is_deterministic_and_counts_are_honoured():
    a = generators.countdown("train", 5, num_samples=30, num_numbers=4)
    assert a == generators.countdown("train", 5, num_samples=30, num_numbers=4)
    assert all(len(r["nums"]) == 4 for r in a)


@pytest.mark.parametrize(
    "make,args,key",
    [
        (generators.arithmetic, {"ops": "/"}, "data.args.ops"),
        (generators.arithmetic, {"min_value": 10, "max_value": 3}, "data.args.max_value"),
        (generators.countdown, {"num_numbers": [4, 2]}, "data.args.num_numbers"),
    ],
)
def test_bad_arguments_name_the_recipe_key(make, args, key):
    with pytest.raises(UserError) as err:
        make("train", 0, **args)
    assert err.value.where == key


def test_too_small_problem_space_for_held_out_split_is_an_error_not_a_hang():
    # One possible problem ("0+0=") whose hash puts it on the training side, or the test side.
    side = "test" if generators._is_held_out("0+0=") else "train"
    other = "train" if side == "test" else "test"
    assert generators.arithmetic(side, 0, num_samples=3, max_value=0, ops="+") == [
        {"prompt": "0+0=", "answer": 0}
    ] * 3
    with pytest.raises(UserError, match="too small"):
        generators.arithmetic(other, 0, num_samples=1, max_value=0, ops="+")


def test_arithmetic_question_style_words_the_same_problems():
    equation = generators.arithmetic("test", 0, num_samples=50, max_value=20)
    question = generators.arithmetic("test", 0, num_samples=50, max_value=20, style="question")
    assert [r["answer"] for r in question] == [r["answer"] for r in equation]
    for q, e in zip(question, equation):
        assert q["prompt"] == "What is " + e["prompt"][:-1].replace("+", " + ").replace("-", " - ") + "?"
    with pytest.raises(UserError) as err:
        generators.arithmetic("train", 0, style="prose")
    assert err.value.where == "data.args.style"
