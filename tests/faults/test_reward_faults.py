"""Rewards that hang or end the process, met by the real `grpo train` and `grpo eval` commands.

Each test writes a reward file, names it in the recipe as ``file.py:function`` and runs the
command in a subprocess on the tiny model. A reward that never returns (sync, or ``async def``)
must end the run with exit code 2 soon after its ``rewards[i].timeout``, naming the reward, the
row and the key to raise; one that calls sys.exit() must not end the run silently.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from cli_runner import run_grpo
from tiny_runs import FAST, TINY_MODEL

TIMEOUT_S = 2
# After the timeout the row is looked for (one more timeout) and the process exits; on a busy
# 2-core machine that is still far less than this.
EXIT_WITHIN_S = 2 * TIMEOUT_S + 20

REWARDS = '''
import asyncio
import sys
import time
from pathlib import Path

STAMP = Path({stamp!r})


def _called():
    if not STAMP.exists():
        STAMP.write_text(str(time.time()))


def sleeps_forever(prompts, completions, **kwargs):
    _called()
    time.sleep(10**6)


async def awaits_forever(prompts, completions, **kwargs):
    _called()
    await asyncio.sleep(10**6)


def exits(prompts, completions, **kwargs):
    _called()
    sys.exit(3)


async def exits_async(prompts, completions, **kwargs):
    _called()
    sys.exit(4)
'''


@pytest.fixture
def rewards_file(tmp_path: Path) -> Path:
    path = tmp_path / "bad_rewards.py"
    path.write_text(REWARDS.format(stamp=str(tmp_path / "called")))
    return path


def _reward(path: Path, function: str) -> str:
    return f'rewards=[{{name="{path}:{function}", timeout={TIMEOUT_S}}}]'


def _train(path: Path, function: str, out: Path):
    return run_grpo("train", "quickstart", *FAST, _reward(path, function), f"train.output_dir={out}",
                    timeout=240)


def _eval(path: Path, function: str, out: Path):
    return run_grpo("eval", "quickstart", "--base", "--n", "2", "--num-prompts", "2", "--max-tokens", "8",
                    "--output-dir", str(out), *TINY_MODEL, "data.args={num_samples=64}",
                    _reward(path, function), timeout=240)


def _check_timed_out(done, path: Path, function: str, ended: float) -> None:
    assert done.returncode == 2, done.stderr[-3000:]
    err = done.stderr
    assert "Traceback" not in err, err
    assert f"reward 'bad_rewards.py:{function}' timed out: no result within {TIMEOUT_S} s" in err, err
    assert "on row 0 (completion " in err, err
    assert f"raise rewards[0].timeout (now {TIMEOUT_S} s" in err, err
    assert f"(waiting at {path}:" in err, err  # the line the reward hangs on
    started = float((path.parent / "called").read_text())
    assert ended - started < EXIT_WITHIN_S, f"exited {ended - started:.1f} s after the reward was called"


@pytest.mark.slow
@pytest.mark.parametrize("function", ["sleeps_forever", "awaits_forever"])
def test_train_stops_on_a_reward_that_never_returns(rewards_file, tmp_path, function):
    done = _train(rewards_file, function, tmp_path / "run")
    _check_timed_out(done, rewards_file, function, time.time())
    assert not list((tmp_path / "run").glob("checkpoints/step-*"))  # it stopped at the first step


@pytest.mark.slow
def test_train_names_a_reward_that_calls_sys_exit(rewards_file, tmp_path):
    done = _train(rewards_file, "exits", tmp_path / "run")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "reward 'bad_rewards.py:exits' called sys.exit(3) on row 0" in done.stderr, done.stderr
    assert f"at {rewards_file}:" in done.stderr  # the line that called it
    assert "never end the process" in done.stderr and 'on_error = "none"' in done.stderr


@pytest.mark.slow
def test_eval_stops_on_a_reward_that_never_returns(rewards_file, tmp_path):
    done = _eval(rewards_file, "sleeps_forever", tmp_path / "eval")
    _check_timed_out(done, rewards_file, "sleeps_forever", time.time())


@pytest.mark.slow
def test_eval_names_an_async_reward_that_calls_sys_exit(rewards_file, tmp_path):
    done = _eval(rewards_file, "exits_async", tmp_path / "eval")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "reward 'bad_rewards.py:exits_async' called sys.exit(4) on row 0" in done.stderr, done.stderr
