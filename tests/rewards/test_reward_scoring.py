"""score(), reward_metrics() and resolve() with real reward functions, sync and async."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from grpocli.errors import UserError
from grpocli.registry.names import Registry
from grpocli.rewards import RewardFn, Scores, resolve, reward_metrics, score
from grpocli.rewards.builtin import format_answer_tag, length
from grpocli.rewards.failures import stop_past_masked_share
from grpocli.rewards.scoring import combine_gated, combine_sum

PROMPTS = ["1+1?", "1+1?", "2+2?", "2+2?"]
COMPLETIONS = ["<answer>2</answer>", "3", "<answer>4</answer>", "<answer>5</answer>"]
COLUMNS = {"answer": [2, 2, 4, 4]}


def exact(prompts, completions, answer, **kwargs):
    return [float(c.endswith(f"{a}</answer>")) for c, a in zip(completions, answer)]


async def slow_async_len(prompts, completions, **kwargs):
    await asyncio.sleep(0.2)
    return [float(len(c)) for c in completions]


def test_columns_reach_the_function_by_name_and_total_is_weighted_sum():
    fns = [RewardFn("exact", exact, weight=2.0), RewardFn("tag", format_answer_tag, weight=0.5)]
    scores = score(fns, PROMPTS, COMPLETIONS, COLUMNS)
    assert scores.per_reward == {"exact": [1.0, 0.0, 1.0, 0.0], "tag": [1.0, 0.0, 1.0, 1.0]}
    assert scores.total == [2.5, 0.0, 2.5, 0.5]
    assert scores.errors == {}


def test_args_and_completion_ids_reach_the_function():
    seen = {}

    def spy(prompts, completions, completion_ids, answer, scale):
        seen.update(ids=completion_ids, answer=answer, scale=scale)
        return [scale] * len(completions)

    scores = score([RewardFn("spy", spy, args={"scale": 3.0})], PROMPTS, COMPLETIONS,
                   {**COLUMNS, "unused": ["x"] * 4}, completion_ids=[[1], [2], [3], [4]])
    assert seen == {"ids": [[1], [2], [3], [4]], "answer": [2, 2, 4, 4], "scale": 3.0}
    assert scores.total == [3.0] * 4


def test_async_rewards_run_concurrently_with_sync_ones():
    fns = [RewardFn(f"slow{i}", slow_async_len) for i in range(3)] + [RewardFn("exact", exact)]
    start = time.perf_counter()
    scores = score(fns, PROMPTS, COMPLETIONS, COLUMNS)
    elapsed = time.perf_counter() - start
    assert elapsed < 0.5  # three 0.2 s sleeps overlapped, not 0.6 s in a row
    assert scores.per_reward["slow2"] == [18.0, 1.0, 18.0, 18.0]
    assert scores.total == [55.0, 3.0, 55.0, 54.0]


def test_timeout_stops_waiting_for_sync_and_async_rewards():
    def hangs(prompts, completions, **kwargs):
        time.sleep(5)

    async def hangs_async(prompts, completions, **kwargs):
        await asyncio.sleep(5)

    for fn in (hangs, hangs_async):
        start = time.perf_counter()
        with pytest.raises(UserError, match="timed out: no result within 0.2 s"):
            score([RewardFn("h", fn, on_error="raise")], PROMPTS, COMPLETIONS, COLUMNS, timeout=0.2)
        assert time.perf_counter() - start < 2
    scores = score([RewardFn("h", hangs_async, on_error="none")], PROMPTS, COMPLETIONS, COLUMNS, timeout=0.1)
    assert scores.per_reward["h"] == [None] * 4 and scores.errors == {"h": 4}


@pytest.mark.parametrize(
    "returned, message",
    [
        ([1.0, 0.0], "2 values for 4 completions"),
        (0.5, "float 0.5"),
        ([1.0, "yes", 0.0, 1.0], "'yes' \\(str\\) at row 1"),
        ([1.0, 0.0, float("inf"), 1.0], "inf at row 2"),
        (np.zeros((2, 2)), "shape \\(2, 2\\)"),
    ],
)
def test_wrong_results_name_the_reward_and_what_is_valid(returned, message):
    with pytest.raises(UserError, match=message) as info:
        score([RewardFn("bad", lambda prompts, completions, **kw: returned)], PROMPTS, COMPLETIONS, {})
    assert "reward 'bad'" in str(info.value) and "one float, int, bool or None" in str(info.value)


def test_arrays_bools_ints_nan_and_none_are_accepted():
    results = [np.array([1.0, 0.0, 1.0, 0.0]), torch.tensor([1, 0, 1, 0]), [True, False, 1, None],
               (0.5, float("nan"), np.float32(1.0), torch.tensor(2.0))]
    fns = [RewardFn(f"r{i}", (lambda r: lambda prompts, completions, **kw: r)(r)) for i, r in enumerate(results)]
    scores = score(fns, PROMPTS, COMPLETIONS, {})
    assert scores.per_reward["r1"] == [1.0, 0.0, 1.0, 0.0]
    assert scores.per_reward["r2"] == [1.0, 0.0, 1.0, None]
    assert scores.per_reward["r3"] == [0.5, None, 1.0, 2.0]
    assert scores.total == [3.5, 0.0, 4.0, 2.0]


def fails_on_five(prompts, completions, **kwargs):
    return [1.0 / (c != "<answer>5</answer>") for c in completions]


def test_raising_reward_names_row_exception_and_hint():
    with pytest.raises(UserError) as info:
        score([RewardFn("div", fails_on_five, on_error="raise")], PROMPTS, COMPLETIONS, COLUMNS)
    text = str(info.value)
    assert "reward 'div' raised ZeroDivisionError" in text
    assert "row 3 (completion '<answer>5</answer>')" in text
    assert 'on_error = "none"' in text and "rewards[0]" in text
    assert "test_reward_scoring.py" in text  # where in the function it raised


def test_raising_reward_with_on_error_none_scores_none_and_counts():
    fns = [RewardFn("div", fails_on_five, on_error="none"), RewardFn("exact", exact)]
    scores = score(fns, PROMPTS, COMPLETIONS, COLUMNS)
    assert scores.per_reward["div"] == [None] * 4
    assert scores.errors == {"div": 4}
    assert scores.total == [1.0, 0.0, 1.0, 0.0]
    metrics = reward_metrics(scores)
    assert metrics["rewards/div/num_errors"] == 4.0 and metrics["rewards/div/num_none"] == 4.0
    assert "rewards/div/mean" not in metrics


def test_by_default_a_failed_call_masks_only_the_rows_that_fail_alone():
    scores = score([RewardFn("div", fails_on_five), RewardFn("exact", exact)], PROMPTS, COMPLETIONS, COLUMNS)
    assert scores.per_reward["div"] == [1.0, 1.0, 1.0, None]  # rows 0-2 scored alone
    assert scores.masked == {"div": [False, False, False, True], "exact": [False] * 4} and scores.errors == {}
    assert scores.failures["div"][0].startswith("raised ZeroDivisionError")
    assert set(scores.seconds) == {"div", "exact"} and all(t >= 0 for t in scores.seconds.values())
    metrics = reward_metrics(scores)
    assert metrics["rewards/div/masked"] == 1.0 and metrics["rewards/div/num_none"] == 1.0
    assert "rewards/exact/masked" not in metrics and "rewards/div/num_errors" not in metrics
    stop_past_masked_share([RewardFn("div", fails_on_five, max_masked_share=0.25)], scores, "at step 7")  # 25%: not past
    with pytest.raises(UserError, match=r"'div' could not score 1 of 4 samples at step 7 \(25%, past "
                                        r"rewards\[0\].max_masked_share = 0.2\): it raised ZeroDivisionError"):
        stop_past_masked_share([RewardFn("div", fails_on_five, max_masked_share=0.2)], scores, "at step 7")

    def batch_only(prompts, completions, **kwargs):  # fails on a batch, never on one row
        if len(completions) > 1:
            raise MemoryError("batch too large")
        return [1.0]

    assert score([RewardFn("b", batch_only)], PROMPTS, COMPLETIONS, {}).masked == {"b": [False] * 4}


def test_function_without_kwargs_gets_only_its_columns_and_a_hint_when_args_miss():
    def trl_style(completions, answer):
        return [float(str(a) in c) for c, a in zip(completions, answer)]

    assert score([RewardFn("t", trl_style)], PROMPTS, COMPLETIONS, {**COLUMNS, "extra": [0] * 4}).total == [
        1.0, 0.0, 1.0, 0.0]
    with pytest.raises(UserError, match="add \\*\\*kwargs"):
        score([RewardFn("t", trl_style, args={"scale": 2}, on_error="raise")], PROMPTS, COMPLETIONS, COLUMNS)


def test_gated_combination_adds_others_only_where_every_gate_passes():
    fns = [RewardFn("tag", format_answer_tag, gate=True, weight=0.5), RewardFn("exact", exact, weight=2.0),
           RewardFn("len", length, weight=1.0, args={"target": 18})]
    scores = score(fns, PROMPTS, COMPLETIONS, COLUMNS, combination="gated")
    # row 1 ("3") fails the gate: only the gate's 0.0 counts, not its length penalty.
    assert scores.total == [2.5, 0.0, 2.5, 0.5]
    assert score(fns, PROMPTS, COMPLETIONS, COLUMNS).total[1] == pytest.approx(-17 / 18)


def test_combinations_on_hand_computed_numbers():
    values = [[1.0, 0.0, None], [0.5, 2.0, 3.0]]
    assert combine_sum(values, [2.0, 1.0], [True, False]) == [2.5, 2.0, 3.0]
    assert combine_gated(values, [2.0, 1.0], [True, False]) == [2.5, 0.0, 0.0]


def test_arg_colliding_with_a_column_names_both():
    with pytest.raises(UserError, match="arg 'answer' and the dataset has a column 'answer'") as info:
        score([RewardFn("exact", exact, args={"answer": 1})], PROMPTS, COMPLETIONS, COLUMNS)
    assert "rewards[0].args.answer" in str(info.value)


def test_batch_shape_errors():
    with pytest.raises(UserError, match="answer has 2 rows for 4 completions"):
        score([RewardFn("exact", exact)], PROMPTS, COMPLETIONS, {"answer": [1, 2]})
    with pytest.raises(UserError, match="repeat"):
        score([RewardFn("e", exact), RewardFn("e", exact)], PROMPTS, COMPLETIONS, COLUMNS)


def test_user_error_inside_a_reward_passes_through_with_where():
    with pytest.raises(UserError, match="rewards\\[0\\] \\(len\\): target must be > 0"):
        score([RewardFn("len", length, args={"target": 0}, on_error="none")], PROMPTS, COMPLETIONS, {})


def test_reward_metrics_mean_std_and_none_count():
    scores = Scores({"a": [1.0, 0.0, None, 1.0]}, [1.0, 0.0, 0.0, 1.0], {})
    metrics = reward_metrics(scores)
    assert metrics["rewards/a/mean"] == pytest.approx(2 / 3)
    assert metrics["rewards/a/std"] == pytest.approx(0.57735, abs=1e-5)  # unbiased, as TRL's nanstd
    assert metrics["rewards/a/num_none"] == 1.0


def registry_with(**fns) -> Registry:
    registry = Registry("reward")
    register = registry.registrar("test", "tests")
    for name, fn in fns.items():
        register(name.replace("_", "."), fn)
    return registry


def spec(name, **kw):
    return SimpleNamespace(name=name, weight=kw.get("weight", 1.0), args=kw.get("args", {}),
                           gate=kw.get("gate", False), on_error=kw.get("on_error", "raise"))


def test_resolve_builds_reward_fns_and_labels_repeats():
    registry = registry_with(my_length=length, my_exact=exact)
    fns = resolve([spec("my.length", args={"target": 5}), spec("my.length", weight=0.1), spec("my.exact", gate=True)],
                  registry)
    assert [f.name for f in fns] == ["my.length", "my.length#2", "my.exact"]
    assert fns[0].args == {"target": 5} and fns[1].weight == 0.1 and fns[2].gate and fns[0].fn is length


def test_resolve_did_you_mean_and_unknown_args():
    registry = registry_with(my_length=length)
    with pytest.raises(UserError, match='did you mean "my.length"') as info:
        resolve([spec("my.lenght")], registry)
    assert "rewards[0].name" in str(info.value)
    with pytest.raises(UserError, match="takes no argument 'targt'") as info:
        resolve([spec("my.length", args={"targt": 5})], registry)
    assert "rewards[0].args.targt" in str(info.value) and "normalize, target, target_length" in str(info.value)

    def plain(completions, scale):
        return [scale] * len(completions)

    registry = registry_with(plain=plain)
    assert resolve([spec("plain", args={"scale": 1})], registry)[0].args == {"scale": 1}
    with pytest.raises(UserError, match="takes no argument 'size'"):
        resolve([spec("plain", args={"size": 1})], registry)


def test_async_reward_that_raises_is_located_or_scored_none():
    async def picky(prompts, completions, **kwargs):
        return [float(int(c)) for c in completions]  # ValueError on tagged completions

    batch = ["1", "<answer>2</answer>"]
    with pytest.raises(UserError, match="raised ValueError.*on row 1 \\(completion '<answer>2</answer>'\\)"):
        score([RewardFn("picky", picky, on_error="raise")], ["p", "p"], batch, {})
    scores = score([RewardFn("picky", picky, on_error="none")], ["p", "p"], batch, {})
    assert scores.per_reward["picky"] == [None, None] and scores.errors == {"picky": 2}
    assert score([RewardFn("picky", picky)], ["p"], ["3"], {}).total == [3.0]
