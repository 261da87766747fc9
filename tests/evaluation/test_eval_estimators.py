"""pass@k, mean@N, maj@N and answer extraction against hand-computed values."""

from __future__ import annotations

import pytest

from grpocli.evaluation.answers import extract_answer
from grpocli.evaluation.estimators import (
    majority_answer,
    majority_at_n,
    mean_at_n,
    pass_at_k,
)
from grpocli.evaluation.evaluator import EvalSettings, summarize


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (4, 1, 1, 0.25),                  # c / n
        (5, 2, 2, 1 - 3 / 10),            # 1 - C(3,2)/C(5,2)
        (10, 3, 5, 1 - 21 / 252),         # 1 - C(7,5)/C(10,5)
        (3, 0, 2, 0.0),                   # nothing correct
        (4, 3, 2, 1.0),                   # n - c < k: every draw of 2 holds a correct one
        (8, 8, 8, 1.0),
    ],
)
def test_pass_at_k_unbiased_estimator(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_rejects_k_above_n():
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_mean_at_n():
    assert mean_at_n([True, False, False, True]) == 0.5
    assert mean_at_n([]) == 0.0


def test_majority_vote_picks_most_frequent_and_judges_it():
    assert majority_answer(["19", None, "7", "19"]) == "19"
    assert majority_at_n(["19", "19", "7", None], [True, True, False, False]) == 1.0
    # a tie goes to the answer seen first ("7"), which is wrong
    assert majority_answer(["7", "19", "7", "19"]) == "7"
    assert majority_at_n(["7", "19", "7", "19"], [False, True, False, True]) == 0.0
    assert majority_at_n([None, None], [True, False]) is None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>12+7</think><answer> 19 </answer>", "19"),
        ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("it is 1,234.", "1234"),
        ("about 19.0", "19"),
        ("<answer>(1 + 2) / 3</answer>", "(1 + 2) / 3"),
        ("no number here", None),
        ("<answer>  </answer>", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def _records(successes: list[list[bool]], answers: list[list[str | None]]) -> list[dict]:
    out = []
    for p, (ss, aa) in enumerate(zip(successes, answers)):
        for j, (s, a) in enumerate(zip(ss, aa)):
            out.append({"prompt_index": p, "sample": j, "reward": 1.0 if s else 0.0,
                        "rewards": {"acc": 1.0 if s else 0.0, "format.soft": None if j == 0 else 1.0},
                        "success": s, "answer": a, "length": 10 + j, "truncated": j == 3})
    return out


def test_summarize_by_hand():
    records = _records(
        [[True, False, False, False], [True, True, False, False]],
        [["3", "4", "4", None], ["5", "5", "6", "6"]],
    )
    m = summarize(records, EvalSettings(n=4, k=(1, 2)))
    assert m["pass@1"] == pytest.approx((1 / 4 + 2 / 4) / 2)
    assert m["pass@2"] == pytest.approx(((1 - 3 / 6) + (1 - 1 / 6)) / 2)
    assert m["mean@4"] == pytest.approx(0.375)
    # prompt 0: majority "4" (both wrong) -> 0; prompt 1: tie, "5" first (both right) -> 1
    assert m["maj@4"] == pytest.approx(0.5)
    assert m["reward"] == pytest.approx(3 / 8)
    assert m["rewards/acc/mean"] == pytest.approx(3 / 8)
    assert m["rewards/format.soft/mean"] == pytest.approx(1.0)  # None rows are left out
    assert m["answer_rate"] == pytest.approx(7 / 8)
    assert m["completions/mean_length"] == pytest.approx(11.5)
    assert m["completions/clipped_ratio"] == pytest.approx(0.25)
    assert m["num_prompts"] == 2
