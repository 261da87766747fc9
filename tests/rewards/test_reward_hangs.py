"""score() with rewards that hang, block the async loop or call sys.exit(): each is handled like
a reward that raised (stop naming reward and row, or None with on_error = "none"), never a
silent exit or a wait without end. The real `grpo train` / `grpo eval` side is in
tests/faults/test_reward_faults.py."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from grpocli.errors import UserError
from grpocli.recipe import load_recipe
from grpocli.registry.names import Registry
from grpocli.rewards import RewardFn, invocation, resolve, score
from grpocli.rewards.builtin import length, math_accuracy

PROMPTS, COMPLETIONS = ["p", "p", "q"], ["a", "bb", "ccc"]


def exits(prompts, completions, **kwargs):
    sys.exit(3)


async def exits_async(prompts, completions, **kwargs):
    sys.exit(4)


def hangs_on_ccc(prompts, completions, **kwargs):
    if "ccc" in completions:
        time.sleep(30)
    return [1.0] * len(completions)


async def blocks_the_loop(prompts, completions, **kwargs):
    time.sleep(3)  # noqa: ASYNC251 - blocking call inside async def: the shared loop stops answering
    return [1.0] * len(completions)


async def fine_async(prompts, completions, **kwargs):
    await asyncio.sleep(0)
    return [2.0] * len(completions)


@pytest.mark.parametrize("fn, code", [(exits, 3), (exits_async, 4)])
def test_sys_exit_in_a_reward_is_an_error_naming_it(fn, code):
    with pytest.raises(UserError) as info:
        score([RewardFn("bye", fn)], PROMPTS, COMPLETIONS, {})
    text = str(info.value)
    assert f"reward 'bye' called sys.exit({code}) on row 0 (completion 'a')" in text
    assert "test_reward_hangs.py" in text and "never end the process" in text
    scores = score([RewardFn("bye", fn, on_error="none"), RewardFn("len", length, args={"target": 1})],
                   PROMPTS, COMPLETIONS, {})
    assert scores.per_reward["bye"] == [None] * 3 and scores.errors == {"bye": 3}
    assert scores.total == [0.0, -1.0, -2.0]  # the other reward still counts


def test_the_reward_fns_own_timeout_bounds_it_and_the_row_is_found():
    start = time.perf_counter()
    with pytest.raises(UserError) as info:
        score([RewardFn("slow", hangs_on_ccc, timeout=0.3)], PROMPTS, COMPLETIONS, {})
    assert time.perf_counter() - start < 3
    text = str(info.value)
    assert "reward 'slow' timed out: no result within 0.3 s on row 2 (completion 'ccc')" in text
    assert "test_reward_hangs.py:" in text  # where it was waiting
    assert "raise rewards[0].timeout (now 0.3 s" in text
    scores = score([RewardFn("slow", hangs_on_ccc, timeout=0.3, on_error="none")], PROMPTS, COMPLETIONS, {})
    assert scores.per_reward["slow"] == [None] * 3 and scores.errors == {"slow": 3}


def test_a_blocked_event_loop_is_named_and_replaced(monkeypatch):
    monkeypatch.setattr(invocation, "LOOP_GRACE_S", 0.2)
    start = time.perf_counter()
    with pytest.raises(UserError) as info:
        score([RewardFn("blocker", blocks_the_loop, timeout=0.2)], PROMPTS, COMPLETIONS, {})
    assert time.perf_counter() - start < 2.5  # not the 3 s the reward blocks for
    text = str(info.value)
    assert "event loop that async rewards share stopped answering" in text and "must await, never block" in text
    assert "test_reward_hangs.py:" in text
    # the next async reward gets a fresh loop instead of queueing behind the blocked one
    assert score([RewardFn("fine", fine_async, timeout=1)], PROMPTS, COMPLETIONS, {}).total == [2.0] * 3


def test_a_reward_that_bounds_its_own_time_runs_in_the_calling_thread():
    threads = []

    def spy(prompts, completions, **kwargs):
        threads.append(threading.current_thread())
        return [0.0] * len(completions)

    score([RewardFn("spy", spy, timeout=5)], PROMPTS, COMPLETIONS, {})
    spy.bounds_own_time = True
    score([RewardFn("spy", spy, timeout=5)], PROMPTS, COMPLETIONS, {})
    assert threads[0] is not threading.current_thread() and threads[1] is threading.current_thread()
    assert math_accuracy.bounds_own_time  # math-verify's alarms need the main thread


def test_recipe_timeout_reaches_the_reward_fn_and_is_bounded():
    recipe = load_recipe("quickstart", []).recipe
    assert recipe.rewards[0].timeout == 300.0
    registry = Registry("reward")
    registry.registrar("test", "tests")("length", length)
    specs = [SimpleNamespace(name="length", weight=1.0, args={}, gate=False, on_error="raise", timeout=t)
             for t in (2.5, 0)]
    assert [f.timeout for f in resolve(specs, registry)] == [2.5, None]  # 0 = no limit
    with pytest.raises(UserError, match="timeout"):
        load_recipe("quickstart", ['rewards=[{name="length", timeout=-1}]'])
