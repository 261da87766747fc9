"""Environments, tools and judges whose answers stall or break a run, met by the real `grpo train`
(issue 31 item 6).

An environment's own methods are bounded as tool calls are (``multi_turn.environment_timeout``):
an OpenEnv step that sleeps, or calls sys.exit / os._exit, stops the run with exit 2 naming it
(it hung without a word, or ended the run silently with its code). A lone surrogate in a tool's
result or an environment's reply reaches the model as U+FFFD (a traceback from the tokenizer). A
thread that never ends (a tool's executor worker, a judge request to a server that never
answers) no longer keeps the process alive after training or after SIGTERM.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runner import ROOT, assert_user_error, run_grpo
from test_tool_faults import caller_model
from tiny_runs import FAST

from grpocli.cli.shutdown import GRACE_S

TIMEOUT_S = 2
RUN = [*FAST, "train.steps=1", "multi_turn.max_turns=2", "generation.max_completion_length=32"]

OPENENV = '''
import os
import sys
import time

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class Said(Action):
    message: str = Field(...)


class Seen(Observation):
    text: str = Field(default="")


class Stuck(Environment):
    """Each step does what HOW says: sleep (for ever), exit (sys.exit(3)) or hard_exit (os._exit(4))."""

    def __init__(self, how: str = "sleep"):
        super().__init__()
        self.how = how

    def reset(self, seed=None, episode_id=None, **kwargs) -> Seen:
        return Seen(text=" Go.", done=False, reward=0.0)

    def step(self, action: Said, timeout_s=None, **kwargs) -> Seen:
        if self.how == "sleep":
            while True:
                time.sleep(1000)
        if self.how == "exit":
            sys.exit(3)
        os._exit(4)

    @property
    def state(self) -> State:
        return State(episode_id="e", step_count=0)
'''

PLAIN = '''
import time


class Replies:
    """Answers each turn with a lone surrogate; reset adds one to the prompt; SLOW_RESET sleeps for ever."""

    def __init__(self, slow_reset: bool = False):
        self.slow_reset = slow_reset

    def reset(self, **row):
        while self.slow_reset:
            time.sleep(1000)
        return " [\\ud800]"

    def respond(self, messages):
        return "bad \\udfff text"
'''

TOOLS = '''
import os
import time
from concurrent.futures import ThreadPoolExecutor

POOL = ThreadPoolExecutor(2)  # its workers are joined when Python exits, daemon or not


def weird() -> str:
    """Return text with a lone surrogate."""
    return "half a pair: \\ud83d!"


def pooled() -> str:
    """Wait for work in a thread pool that never ends."""
    open(os.environ["GRPO_TEST_MARK"], "w").close()
    return POOL.submit(time.sleep, 10**6).result()
'''


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _rollouts(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "rollouts" / "step-1.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize(("how", "says"), [
    # a step that sleeps takes the path of the reset below; sys.exit the path of os._exit (both also
    # without a model: tests/multiturn/test_environment_calls.py)
    ("hard_exit", "called os._exit(4) at "),
])
def test_an_openenv_step_that_hangs_or_exits_stops_the_run_naming_it(tmp_path, how, says):
    pytest.importorskip("openenv")
    env = _write(tmp_path, "stuck_env.py", OPENENV)
    started = time.monotonic()
    done = run_grpo("train", "quickstart", *RUN, f"multi_turn.environment='openenv:{env}:Stuck'",
                    f"multi_turn.environment_args={{how='{how}'}}", f"multi_turn.environment_timeout={TIMEOUT_S}",
                    f"train.output_dir='{tmp_path / 'run'}'", timeout=300)
    assert_user_error(done, f"respond() of the environment 'openenv:{env}:Stuck' {says}{env}:", "multi_turn.environment")
    assert time.monotonic() - started < 200
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_a_reset_that_hangs_stops_the_run_naming_it(tmp_path):
    env = _write(tmp_path, "plain_env.py", PLAIN)
    done = run_grpo("train", "quickstart", *RUN, f"multi_turn.environment='{env}:Replies'",
                    "multi_turn.environment_args={slow_reset=true}", f"multi_turn.environment_timeout={TIMEOUT_S}",
                    f"train.output_dir='{tmp_path / 'run'}'", timeout=300)
    assert_user_error(done, f"reset() of the environment '{env}:Replies' did not return within {TIMEOUT_S} s "
                      f"(waiting at {env}:")


@pytest.mark.slow
def test_lone_surrogates_from_an_environment_reach_the_model_as_replacement_characters(tmp_path):
    env = _write(tmp_path, "plain_env.py", PLAIN)
    out = tmp_path / "run"
    done = run_grpo("train", "quickstart", *RUN, f"multi_turn.environment='{env}:Replies'", f"train.output_dir='{out}'",
                    "generation.max_completion_length=128", timeout=300)  # room for turns that end (EOS): replies
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _rollouts(out)
    replies = [m["content"] for r in rows for m in r["conversation"] if m["role"] == "user"]
    assert replies and all(text == "bad \ufffd text" for text in replies), replies
    # reset's " [\ud800]" joined every prompt, which the tokenizer refused (the run's exit 0 says it took it)


@pytest.mark.slow
def test_a_lone_surrogate_in_a_tool_result_reaches_the_model(tmp_path):
    tools = _write(tmp_path, "odd_tools.py", TOOLS)
    model = caller_model(tmp_path / "model", "weird")
    out = tmp_path / "run"
    done = run_grpo("train", "quickstart", *RUN, f"model.name_or_path={model}", "generation.max_completion_length=128",
                    f'tools=[{{name="{tools}:weird"}}]', f"train.output_dir='{out}'", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [m["content"] for r in _rollouts(out) for m in r["conversation"] if m["role"] == "tool"]
    assert results and all(text == "half a pair: \ufffd!" for text in results), results


def _train_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "grpocli.cli.app", "train", "quickstart", *RUN, *args]


@pytest.mark.slow
def test_threads_that_never_end_do_not_keep_the_process_alive(tmp_path):
    """A tool waits on a thread pool's worker, and the judge's requests go to a server that never
    answers (the reward gives the batch up at its timeout, on_error = "none"; the client's timeout is
    an hour): Python's exit joined those threads, so the run ended and the process stayed (for ever);
    now it exits GRACE_S after training, naming them."""
    tools = _write(tmp_path, "odd_tools.py", TOOLS)
    model = caller_model(tmp_path / "model", "pooled")
    out = tmp_path / "run"
    with socket.socket() as hole:  # accepts connections (the backlog), never answers
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)
        url = f"http://127.0.0.1:{hole.getsockname()[1]}/v1"
        judge = (f'rewards=[{{name="judge", timeout={TIMEOUT_S}, on_error="none", args={{model="m", '
                 f'base_url="{url}", timeout=3600, max_retries=0, concurrency=4}}}}]')
        done = run_grpo("train", "quickstart", *RUN, f"model.name_or_path={model}", "generation.max_completion_length=128",
                        f'tools=[{{name="{tools}:pooled"}}]', f"multi_turn.tool_timeout={TIMEOUT_S}", judge,
                        f"train.output_dir='{out}'", env={"GRPO_TEST_MARK": str(tmp_path / "called")}, timeout=300)
        ended = time.time()
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "called").exists()  # the tool ran
    assert "thread(s) still run code that never returned" in done.stderr, done.stderr[-3000:]
    assert "grpo-judge" in done.stderr and "grpo exits without waiting for them" in done.stderr, done.stderr[-3000:]
    trained = max(p.stat().st_mtime for p in (out / "checkpoints").rglob("*"))
    assert ended - trained < GRACE_S + 30, ended - trained  # the grace, and the exit on a loaded machine


@pytest.mark.slow
def test_sigterm_ends_a_run_whose_tool_never_returns(tmp_path):
    tools = _write(tmp_path, "odd_tools.py", TOOLS)
    model = caller_model(tmp_path / "model", "pooled")
    mark = tmp_path / "called"
    cmd = _train_command(f"model.name_or_path={model}", "generation.max_completion_length=128",
                         f'tools=[{{name="{tools}:pooled"}}]', "multi_turn.tool_timeout=600",
                         f"train.output_dir='{tmp_path / 'run'}'")
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**__import__("os").environ, "GRPO_TEST_MARK": str(mark)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert mark.exists(), proc.communicate(timeout=5) if proc.poll() is not None else "the tool was never called"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=GRACE_S + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "stopped by SIGTERM" in stderr and "Traceback" not in stderr, stderr[-3000:]
