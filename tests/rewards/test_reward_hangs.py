"""score() with rewards that hang, block the async loop or call sys.exit(): each is handled like
a reward that raised (stop naming reward and row, or None with on_error = "none"), never a
silent exit or a wait without end. The real `grpo train` / `grpo eval` side is in
tests/faults/test_reward_faults.py."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
from cli_runner import ROOT

from grpocli.errors import UserError
from grpocli.recipe import load_recipe
from grpocli.registry.names import Registry
from grpocli.rewards import RewardFn, invocation, resolve, score, watchdog
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
        score([RewardFn("bye", fn, on_error="raise")], PROMPTS, COMPLETIONS, {})
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
        score([RewardFn("slow", hangs_on_ccc, timeout=0.3, on_error="raise")], PROMPTS, COMPLETIONS, {})
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
        score([RewardFn("blocker", blocks_the_loop, timeout=0.2, on_error="raise")], PROMPTS, COMPLETIONS, {})
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


# -- signals, os._exit, copies, status (the real `grpo train` side: tests/faults/test_reward_faults.py) --
def alarmed(prompts, completions, **kwargs):
    """Bounds itself as math-verify does: a SIGALRM handler and an alarm, which need the main thread."""
    def late(signum, frame):
        raise TimeoutError("too slow")

    old = signal.signal(signal.SIGALRM, late)
    signal.alarm(5)
    try:
        return [float(len(c)) for c in completions]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


async def alarmed_async(prompts, completions, **kwargs):
    return alarmed(prompts, completions)


def alarmed_then_spins(prompts, completions, **kwargs):
    """Sets an alarm (so it must run in the main thread), then spins on 'ccc', catching every Exception."""
    signal.signal(signal.SIGALRM, signal.getsignal(signal.SIGALRM))
    while "ccc" in completions:
        try:
            time.sleep(0.01)
        except Exception:  # noqa: BLE001, S110 - as math-verify catches its own errors
            pass
    return [1.0] * len(completions)


def test_a_reward_that_sets_an_alarm_runs_in_the_main_thread_within_its_timeout(capsys):
    assert score([RewardFn("alarmed", alarmed, timeout=5)], PROMPTS, COMPLETIONS, {}).total == [1.0, 2.0, 3.0]
    assert id(alarmed) in invocation._main_thread_only  # from now on straight to the main thread
    assert score([RewardFn("alarmed", alarmed, timeout=5)], PROMPTS, COMPLETIONS, {}).total == [1.0, 2.0, 3.0]
    threads, start = threading.active_count(), time.monotonic()
    with pytest.raises(UserError) as info:  # the timeout still holds, and stops the call
        score([RewardFn("spins", alarmed_then_spins, timeout=1, on_error="raise")], PROMPTS, COMPLETIONS, {})
    assert time.monotonic() - start < 8
    text = str(info.value)
    assert "reward 'spins' timed out: no result within 1 s on row 2 (completion 'ccc')" in text, text
    assert "test_reward_hangs.py:" in text  # where it was when stopped
    assert threading.active_count() == threads  # nothing left running
    assert signal.getsignal(watchdog.WATCHDOG_SIGNAL) in (signal.SIG_DFL, None)  # the handler is put back
    none = score([RewardFn("spins", alarmed_then_spins, timeout=1, on_error="none")], PROMPTS, COMPLETIONS, {})
    assert none.per_reward["spins"] == [None] * 3 and none.errors == {"spins": 3}
    assert "the call was stopped" in capsys.readouterr().err


@pytest.mark.parametrize("fn, key", [(alarmed, "score from the main thread"), (alarmed_async, "make it a plain def")])
def test_a_reward_that_sets_an_alarm_off_the_main_thread_is_told_what_to_do(fn, key):
    box = {}

    def off_main():
        try:
            score([RewardFn("alarmed", fn, timeout=5, on_error="raise")], PROMPTS, COMPLETIONS, {})
        except UserError as err:
            box["err"] = err

    thread = threading.Thread(target=off_main)
    thread.start()
    thread.join()
    text = str(box["err"])
    assert "raised ValueError: signal only works in main thread" in text
    assert key in text and "parsing_timeout=None" in text or key == "make it a plain def", text
    assert key in text and "test_reward_hangs.py:" in text  # the reward's line, not signal.py's
    # timeout = 0 (None here) runs it in the calling thread, this test's main thread, where the alarm works
    assert score([RewardFn("alarmed", alarmed)], PROMPTS, COMPLETIONS, {}).total == [1.0, 2.0, 3.0]


EXITS_HARD = """
import json, multiprocessing, os, sys
from grpocli.errors import UserError
from grpocli.rewards import RewardFn, score

def child(code):
    os._exit(code)

def forks_then_exits(prompts, completions, **kwargs):
    codes = []
    for target, args in ((int, ()), (child, (5,))):  # multiprocessing ends its child with os._exit too
        p = multiprocessing.get_context("fork").Process(target=target, args=args)
        p.start()
        p.join(60)
        codes.append(p.exitcode)
    print(json.dumps(codes), flush=True)
    os._exit(7)

try:
    score([RewardFn("hard", forks_then_exits, timeout=TIMEOUT, on_error="raise")], ["p"], ["a"], {}, state={})  # no transformers
except UserError as exc:
    print(exc, flush=True)
    sys.exit(2)
"""


@pytest.mark.parametrize("timeout", [None, 30])  # in the calling thread, in a thread of its own
def test_os_exit_in_a_reward_is_an_error_and_a_forked_child_still_exits(tmp_path, timeout):
    """In a process of its own: were os._exit not caught, it would end pytest."""
    script = tmp_path / "exits_hard.py"
    script.write_text(EXITS_HARD.replace("TIMEOUT", repr(timeout)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script)], check=False, capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr[-3000:])
    assert done.stdout.splitlines()[0] == "[0, 5]", done.stdout  # the children ended as they asked
    assert "reward 'hard' called os._exit(7) on row 0 (completion 'a')" in done.stdout, done.stdout
    assert f"at {script}:" in done.stdout and "never end the process" in done.stdout
    assert "Traceback" not in done.stderr, done.stderr


def test_each_reward_gets_its_own_copies_of_the_batch():
    prompts = [[{"role": "user", "content": "2+2?"}]] * 2
    completions, ids, columns = ["4", "5"], [[1, 2], [3]], {"answer": [["4"], ["4"]]}

    def vandal(prompts, completions, completion_ids, answer, **kwargs):
        prompts[0][0]["content"] = completions[0][0]["content"] = "changed"
        completions.append([{"role": "assistant", "content": "extra"}])
        completion_ids[0].append(9)
        answer[1].append("changed")
        return [0.0, 0.0]

    seen = {}

    def witness(prompts, completions, completion_ids, answer, **kwargs):
        seen.update(prompts=prompts, completions=completions, completion_ids=completion_ids, answer=answer)
        return [1.0, 1.0]

    score([RewardFn("vandal", vandal), RewardFn("witness", witness)], prompts, completions, columns,
          completion_ids=ids)
    assert prompts == [[{"role": "user", "content": "2+2?"}]] * 2  # the caller's, as they were
    assert (completions, ids, columns) == (["4", "5"], [[1, 2], [3]], {"answer": [["4"], ["4"]]})
    assert seen["prompts"] == prompts and seen["completion_ids"] == ids and seen["answer"] == [["4"], ["4"]]
    assert seen["completions"] == [[{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "5"}]]


def test_the_status_names_each_reward_before_it_is_called():
    said: list[str] = []

    def first(prompts, completions, **kwargs):
        assert said[-1] == "'first'"
        return [0.0] * len(completions)

    async def second(prompts, completions, **kwargs):
        return [0.0] * len(completions)

    def third(prompts, completions, **kwargs):
        assert said[-1] == "'third'"
        return [0.0] * len(completions)

    score([RewardFn("first", first), RewardFn("second", second), RewardFn("third", third)],
          PROMPTS, COMPLETIONS, {}, doing=said.append)
    assert said == ["'second'", "'first'", "'third'"]  # async ones start first, together
