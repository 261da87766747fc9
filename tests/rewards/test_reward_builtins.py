"""The built-in rewards on hand-written completions, in string and conversational form."""

from __future__ import annotations

import threading

import pytest

from grpocli.errors import UserError
from grpocli.registry.names import Registry
from grpocli.rewards import builtin
from grpocli.rewards.builtin import (
    arithmetic_exact,
    countdown_equation,
    format_answer_tag,
    format_soft,
    format_strict,
    length,
    math_accuracy,
    reasoning_steps,
)


def chat(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def both(texts: list[str]) -> list[list]:
    """The same completions as strings and as conversational messages."""
    return [texts, [chat(t) for t in texts]]


STRICT_OK = "<think>\nadd them\n</think>\n<answer>\n4\n</answer>"


def test_register_rewards_registers_every_builtin_with_a_description():
    registry = Registry("reward")
    builtin.register_rewards(registry.registrar("grpocli.rewards.builtin", "grpocli"))
    names = {e.name for e in registry}
    assert {"format.strict", "format.soft", "math.accuracy", "countdown.equation", "length",
            "arithmetic.exact", "format.answer_tag", "reasoning.steps"} <= names
    assert all(e.description for e in registry)


@pytest.mark.parametrize("form", [0, 1])
def test_format_strict(form):
    texts = [
        STRICT_OK,
        "<think>add them</think><answer>4</answer>",  # no newlines
        "So: " + STRICT_OK,  # text before
        STRICT_OK + "\n<answer>\n5\n</answer>",  # a second answer
        "<think>\na\n</think>\n\n<answer>\n4\n</answer>",  # blank line between
    ]
    assert format_strict([""] * 5, both(texts)[form]) == [1.0, 0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("form", [0, 1])
def test_format_soft(form):
    texts = [
        "Sure. <think> add </think>   <answer>4</answer> done",
        STRICT_OK,
        "<answer>4</answer><think>x</think>",  # wrong order
        "<think>only thinking</think>",
    ]
    assert format_soft([""] * 4, both(texts)[form]) == [1.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("form", [0, 1])
def test_format_answer_tag(form):
    texts = ["x <answer>4</answer>", "<answer>4</answer><answer>5</answer>", "<answer>4", "4"]
    assert format_answer_tag([""] * 4, both(texts)[form]) == [1.0, 0.0, 0.0, 0.0]


def test_reasoning_steps_counts_markers_up_to_min_steps():
    texts = ["Step 1: a\nStep 2: b\nStep 3: c\nStep 4: d", "First, a. Next, b.", "just 4"]
    assert reasoning_steps([""] * 3, texts) == [1.0, pytest.approx(2 / 3), 0.0]
    assert reasoning_steps([""] * 3, texts, min_steps=2) == [1.0, 1.0, 0.0]


@pytest.mark.parametrize("form", [0, 1])
def test_length_normalized_and_raw(form):
    texts = ["a" * 20, "a" * 10, "a" * 30, ""]
    assert length([""] * 4, both(texts)[form]) == [0.0, -0.5, -0.5, -1.0]
    assert length([""] * 4, both(texts)[form], target=10, normalize=False) == [-10.0, 0.0, -20.0, -10.0]


def test_length_target_length_avoids_a_target_column():
    # Countdown data has a 'target' column, which arrives under the same keyword.
    with pytest.raises(UserError, match="target_length"):
        length(["p"], ["abc"], target=[24])
    assert length(["p"], ["abc"], target=[24], target_length=3) == [0.0]
    with pytest.raises(UserError, match="target must be > 0"):
        length(["p"], ["abc"], target=0)


@pytest.mark.parametrize("form", [0, 1])
def test_arithmetic_exact(form):
    texts = ["2 + 3 = 5", "<answer>5</answer> and later 7", "it is 1,234", "no number", "6"]
    answers = [5, "5", 1234, 5, "not an int"]
    got = arithmetic_exact([""] * 5, both(texts)[form], answer=answers)
    assert got == [1.0, 1.0, 1.0, 0.0, None]


def test_arithmetic_exact_without_answer_column_names_the_column():
    with pytest.raises(UserError, match="'answer'"):
        arithmetic_exact(["p"], ["5"], question=["q"])


@pytest.mark.parametrize("form", [0, 1])
def test_countdown_equation(form):
    texts = [
        "<think>..</think><answer>(6 - 2) * 4 + 2</answer>",  # 18 with 6,2,4,2? see nums
        "<answer>(6 - 2) * 4</answer>",  # leaves a number out
        "thinking\n(6 - 2) * 4 + 2 = 18",  # last line, with '= result'
        "<answer>6 * 4 - 2 - 2</answer>",  # right numbers, wrong value (20)
        "<answer>6 * 6 - 2 - 2</answer>",  # 6 used twice, 4 unused
        "<answer>__import__('os').system('echo hi')</answer>",
        "<answer>6 ** 4 - 2 - 2</answer>",  # power is no Countdown operator
        "<answer>6 / (2 - 2) + 4</answer>",  # right numbers, divides by zero
        "no answer at all",
    ]
    nums, target = [[6, 2, 4, 2]] * 9, [18] * 9
    got = countdown_equation([""] * 9, both(texts)[form], nums=nums, target=target)
    assert got == [1.0, 0.0, 1.0, 0.1, 0.0, 0.0, 0.0, 0.1, 0.0]


def test_countdown_exact_fractions_and_format_score_arg():
    # 3 / 7 * 7 is 3 exactly in fractions (float arithmetic would give 2.9999999999999996).
    assert countdown_equation(["p"], ["<answer>3 / 7 * 7</answer>"], nums=[[3, 7, 7]], target=[3]) == [1.0]
    got = countdown_equation(["p"], ["<answer>3 + 7 + 7</answer>"], nums=[[3, 7, 7]], target=[3], format_score=0.0)
    assert got == [0.0]


def test_math_accuracy_with_real_expressions():
    completions = [
        "<think>half</think> so \\boxed{\\frac{1}{2}}",
        "<answer>\n\\frac{1}{2}\n</answer>",
        "first \\boxed{2} then corrected \\boxed{0.5}",  # the last box counts
        "\\boxed{\\frac{1}{3}}",
        "the answer is 0.5",  # whole completion
    ]
    got = math_accuracy([""] * 5, both(completions)[1], answer=["0.5"] * 5)
    assert got == [1.0, 1.0, 1.0, 0.0, 1.0]


def test_math_accuracy_solution_column_unparsable_gold_and_answer_column_arg():
    got = math_accuracy(["", ""], ["\\boxed{x^2+1}", "\\boxed{3}"], solution=["$x^2 + 1$", "no gold here"])
    assert got == [1.0, None]
    got = math_accuracy([""], ["\\boxed{12}"], answer_column="final", final=[12])
    assert got == [1.0]
    with pytest.raises(UserError, match="answer_column"):
        math_accuracy([""], ["\\boxed{12}"], question=["q"])


def test_math_accuracy_works_off_the_main_thread():
    result: dict = {}

    def run() -> None:
        try:
            result["v"] = math_accuracy([""], ["\\boxed{\\frac{2}{4}}"], answer=["1/2"])
        except Exception as exc:  # pragma: no cover - the failure is asserted below
            result["v"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    assert result["v"] == [1.0]


def test_the_tag_readers_agree_with_their_regular_expressions_on_random_text():
    """answer_tag, soft_format and last_boxed read as the expressions they replace (ANSWER_TAG's
    last match, SOFT_FORMAT.search, the last closed \\boxed{}) on random mixes of their pieces."""
    import random
    import re

    from grpocli.rewards.builtin import SOFT_FORMAT, soft_format
    from grpocli.rewards.text import ANSWER_TAG, answer_tag, last_boxed

    def boxed_by_brute_force(text):
        for start in reversed([m.start() for m in re.finditer(re.escape("\\boxed{"), text)]):
            depth = 0
            for j in range(start + len("\\boxed"), len(text)):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                if depth == 0:
                    return text[start + len("\\boxed{") : j]
        return None

    pieces = ["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "x", "\\boxed{", "{", "}", "7"]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        found = ANSWER_TAG.findall(text)
        assert answer_tag(text) == (found[-1].strip() if found else None), text
        assert soft_format(text) == bool(SOFT_FORMAT.search(text)), text
        assert last_boxed(text) == boxed_by_brute_force(text), text


@pytest.mark.parametrize("crafted", ["<answer>" * 25_000, "<think>" * 25_000, "<think>" + "</think> " * 20_000,
                                     "\\boxed{" * 25_000, "\\boxed{{" * 20_000])
def test_a_completion_crafted_for_the_tag_readers_is_read_in_linear_time(crafted):
    """What a completion can reach: 40 KB of "<answer>" (or "<think>") held the reward for 3-4 s in
    the regular expressions (quadratic); 200 KB now reads in milliseconds."""
    import time

    from grpocli.rewards.builtin import format_answer_tag, format_soft
    from grpocli.rewards.text import last_boxed

    started = time.perf_counter()
    format_soft([""], [crafted])
    format_answer_tag([""], [crafted])
    last_boxed(crafted)
    assert time.perf_counter() - started < 0.5


def _openr1_tag_count_reward(completions, **kwargs):
    """open-r1's tag_count_reward (src/open_r1/rewards.py), as written there."""
    def count_tags(text: str) -> float:
        count = 0.0
        if text.count("<think>\n") == 1:
            count += 0.25
        if text.count("\n</think>\n") == 1:
            count += 0.25
        if text.count("\n<answer>\n") == 1:
            count += 0.25
        if text.count("\n</answer>") == 1:
            count += 0.25
        return count
    return [count_tags(completion[0]["content"]) for completion in completions]


def test_format_tag_count_is_open_r1s_tag_count_reward():
    texts = ["<think>\na\n</think>\n<answer>\n1\n</answer>", "<think>\na\n</think>\n<answer>1</answer>",
             "<think>a</think><answer>1</answer>", "<think>\n<think>\nx\n</think>\n", "", "\n</answer>"]
    messages = [[{"role": "assistant", "content": t}] for t in texts]
    ours = builtin.format_tag_count([""] * len(texts), messages)
    assert ours == _openr1_tag_count_reward(messages) == [1.0, 0.5, 0.0, 0.25, 0.0, 0.25]
    assert builtin.format_tag_count([""] * len(texts), texts) == ours  # text completions too
