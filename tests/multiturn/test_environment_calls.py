"""An environment's own methods under multi_turn.environment_timeout, without a model: a call that
hangs, raises, exits or refuses a thread; async methods; what it returns (issue 31 item 6).
(The real `grpo train` meets them in tests/faults/test_environment_faults.py.)"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from grpocli.errors import UserError
from grpocli.multiturn.environment_calls import EnvironmentCalls
from grpocli.multiturn.execution import well_formed

CALLS = EnvironmentCalls("environment 'test_env'", timeout=0.5)
VALID = "respond(messages)"


RELEASE = threading.Event()  # what a call that "never returns" waits for: set at each test's end


def _sleeps() -> None:
    RELEASE.wait()


@pytest.fixture(autouse=True)
def no_thread_left():
    """A call given up at its timeout goes on in its thread: released here, so that none is left."""
    RELEASE.clear()
    yield
    RELEASE.set()
    for thread in threading.enumerate():
        if thread.name == "grpo-environment":
            thread.join(5)
    assert not [t for t in threading.enumerate() if t.name == "grpo-environment"]


@pytest.mark.parametrize(("fn", "says"), [
    (_sleeps, "respond() of the environment 'test_env' did not return within 0.5 s (waiting at "),
    (lambda: sys.exit(3), "respond() of the environment 'test_env' called sys.exit(3) at "),
    (lambda: os._exit(4), "respond() of the environment 'test_env' called os._exit(4) at "),
    (lambda: 1 / 0, "respond() of the environment 'test_env' raised ZeroDivisionError: division by zero at "),
])
def test_a_call_that_hangs_exits_or_raises_is_a_user_error_naming_it(fn, says):
    started = time.monotonic()
    with pytest.raises(UserError) as info:
        CALLS.call("respond()", fn, VALID)
    assert says in info.value.what and __file__ in info.value.what, info.value.what
    assert info.value.where == "multi_turn.environment"
    assert time.monotonic() - started < 5


def test_the_timeout_message_names_the_key_to_raise():
    with pytest.raises(UserError) as info:
        CALLS.call("reset()", _sleeps, VALID)
    assert "multi_turn.environment_timeout=SECONDS" in info.value.hint


def test_an_async_method_is_awaited_and_text_comes_back_well_formed():
    class Env:
        async def respond(self, messages):
            return "half \ud800 pair"

        def reset(self, **row):
            return "\udfff"

    assert CALLS.respond(Env(), [{"role": "user", "content": "hi"}]) == "half \ufffd pair"
    assert CALLS.reset(Env(), {"prompt": "p", "prompt_text": "p"}) == "\ufffd"
    assert well_formed("fine") == "fine"


def test_metrics_that_are_no_floats_are_named():
    class Env:
        def get_metrics(self):
            return {"size": 10**400}

    with pytest.raises(UserError, match="get_metrics\\(\\) of the environment 'test_env' gave 'size' = a int"):
        CALLS.metrics([Env()])


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="needs the main thread")
def test_an_environment_that_refuses_a_thread_runs_in_the_main_thread_still_bounded():
    """verifiers' loaders set a signal handler, which only the main thread may: such an environment
    is called in the main thread from then on, the watchdog stopping a call at the timeout."""
    calls = EnvironmentCalls("environment 'signals'", timeout=0.5)
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        made = calls.new(lambda: (signal.signal(signal.SIGUSR1, signal.SIG_IGN), "made")[1])
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert made and calls.main_thread
    started = time.monotonic()
    with pytest.raises(UserError, match="did not return within 0.5 s"):
        calls.call("respond()", _sleeps, VALID)  # in the main thread: stopped, not left behind
    assert time.monotonic() - started < 5
    assert threading.current_thread() is threading.main_thread()


def test_a_huge_reset_observation_is_cut_to_what_the_prompt_can_hold_before_tokenizing():
    """reset's text joins the prompt's end, kept to data.max_prompt_length tokens: 50 MB of it is
    cut in characters first (tokenizing 10 MB whole took 20 s here), and the prompt's tokens are the same."""
    from turn_fixtures import ROWS, recipe

    from grpocli.models import load_tokenizer
    from grpocli.multiturn.toolbox import Toolbox
    from grpocli.multiturn.turns import TurnLoop

    class Huge:
        def reset(self, **row):
            return " " + "abc " * 12_500_000 + "THE END"

    r = recipe("tools=[]", "data.max_prompt_length=64")
    loop = TurnLoop(Toolbox([], environment=Huge), load_tokenizer(r.model), r)
    started = time.monotonic()
    ids = loop.prompts(ROWS[:1], [Huge()], 1)
    assert time.monotonic() - started < 10
    assert len(ids[0]) == 64 and "THE END" in loop.tokenizer.decode(ids[0])
