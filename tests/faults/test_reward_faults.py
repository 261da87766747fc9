"""Rewards that hang or end the process, met by the real `grpo train` and `grpo eval` commands.

Each test writes a reward file, names it in the recipe as ``file.py:function`` and runs the
command in a subprocess on the tiny model. A reward that never returns (sync, or ``async def``)
must end the run with exit code 2 soon after its ``rewards[i].timeout``, naming the reward, the
row and the key to raise; one that calls sys.exit() or os._exit() must not end the run silently;
(a math-verify reward, which sets alarms, trains: tests/rewards/test_trl_reward_habits.py); timed-out calls
left spinning are counted and stop the run before they eat it; what a reward does to the lists
it is given never reaches the rollouts; and a plugin (installed, found by entry point) or a reward
file whose import calls sys.exit() is named instead of ending the command with its exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runner import ROOT, install_plugin, run_grpo
from tiny_runs import FAST, TINY_MODEL

TIMEOUT_S = 2
# After the timeout the row is looked for (one more timeout) and the process exits; on a busy
# 2-core machine that is still far less than this.
EXIT_WITHIN_S = 2 * TIMEOUT_S + 20

REWARDS = '''
import asyncio
import os
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


def exits_hard_at_step_2(prompts, completions, trainer_state, **kwargs):
    if trainer_state.global_step >= 1:
        os._exit(7)
    return [0.0] * len(completions)


def spins(prompts, completions, **kwargs):
    while True:  # a loop without end that never waits: it takes CPU as long as the process lives
        pass


def mutates(prompts, completions, completion_ids, answer, **kwargs):
    scores = [float(len(c)) for c in completions]
    completions[:] = ["MUTATED"] * len(completions)
    prompts[:] = ["MUTATED"] * len(prompts)
    answer[:] = [-1] * len(answer)
    for ids in completion_ids:
        ids.extend([9] * 50)
    return scores
'''


@pytest.fixture
def rewards_file(tmp_path: Path) -> Path:
    path = tmp_path / "bad_rewards.py"
    path.write_text(REWARDS.format(stamp=str(tmp_path / "called")))
    return path


def _reward(path: Path, function: str) -> str:  # on_error = "raise": stop at the first failure, naming the row
    return f'rewards=[{{name="{path}:{function}", timeout={TIMEOUT_S}, on_error="raise"}}]'


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
    assert f"reward '{function}' timed out: no result within {TIMEOUT_S} s" in err, err
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
    assert "reward 'exits' called sys.exit(3) on row 0" in done.stderr, done.stderr
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
    assert "reward 'exits_async' called sys.exit(4) on row 0" in done.stderr, done.stderr


def _steps(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [line for line in map(json.loads, lines) if "loss" in line]


@pytest.mark.slow
def test_a_reward_that_calls_os_exit_is_named_and_earlier_steps_are_kept(rewards_file, tmp_path):
    out = tmp_path / "run"
    done = run_grpo("train", "quickstart", *FAST,
                    f'rewards=[{{name="{rewards_file}:exits_hard_at_step_2", on_error="raise"}}]',
                    f"train.output_dir={out}", timeout=240)
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    err = done.stderr
    assert "Traceback" not in err, err
    assert "reward 'exits_hard_at_step_2' called os._exit(7) on row 0" in err, err
    assert f"at {rewards_file}:" in err and "never end the process" in err, err
    assert [x["step"] for x in _steps(out)] == [1]  # the step before it is kept


@pytest.mark.slow
def test_timed_out_calls_left_spinning_are_counted_and_stop_the_run(rewards_file, tmp_path):
    out = tmp_path / "run"
    reward = f'rewards=[{{name="{rewards_file}:spins", timeout=1, on_error="none"}}]'
    done = run_grpo("train", "quickstart", *FAST, reward, "train.steps=8", f"train.output_dir={out}", timeout=240)
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    err = done.stderr
    assert "Traceback" not in err, err
    for n in (1, 2, 3):  # one warning per call left running, counting them
        assert "warning: reward 'spins' timed out (no result within 1 s)" in err, err
        assert f"{n} such call(s) of it still run, and at 4 the run stops" in err, err
    assert "reward 'spins' timed out again (no result within 1 s) and 4 of its calls that timed " \
           "out still run in background threads" in err, err
    assert "rewards[0].timeout" in err and f"(waiting at {rewards_file}:" in err, err
    assert [x["step"] for x in _steps(out)] == [1, 2, 3]  # what ran is kept


@pytest.mark.slow
def test_a_reward_that_mutates_its_arguments_does_not_change_the_rollouts(rewards_file, tmp_path):
    out = tmp_path / "run"
    rewards = f'rewards=[{{name="{rewards_file}:mutates"}}, {{name="length", args={{target=8}}}}]'
    done = run_grpo("train", "quickstart", *FAST, rewards, f"train.output_dir={out}", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "rollouts" / "step-1.jsonl").read_text().splitlines()]
    assert rows and not any("MUTATED" in json.dumps(row) for row in rows)
    assert all(row["columns"]["answer"] != -1 for row in rows)
    for row in rows:  # the reward after it saw the completions as generated
        assert row["rewards"]["mutates"] == float(len(row["completion"]))
        assert row["rewards"]["length"] == -abs(len(row["completion"]) - 8) / 8
    assert all(x["completions/max_length"] <= 8 for x in _steps(out))  # the ids trained on: as generated


PLUGIN_PYPROJECT = """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "grpo-quitter"
version = "0.1.0"
dependencies = ["grpocli"]

[project.entry-points.grpo]
quitter = "grpo_quitter"

[tool.hatch.build.targets.wheel]
only-include = ["grpo_quitter.py"]
"""


def test_a_plugin_whose_import_calls_sys_exit_is_named(tmp_path):
    source = tmp_path / "grpo-quitter"
    source.mkdir()
    (source / "pyproject.toml").write_text(PLUGIN_PYPROJECT)
    (source / "grpo_quitter.py").write_text("import sys\n\nsys.exit(5)  # at import\n")
    site = install_plugin(source, tmp_path / "site")
    env = {k: v for k, v in os.environ.items() if k not in ("GRPO_PLUGINS", "GRPO_DISABLE_PLUGIN_AUTOLOAD")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    done = subprocess.run([sys.executable, "-m", "grpocli.cli.app", "train", "quickstart", "--dry-run"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    err = done.stderr
    assert "Traceback" not in err, err
    assert "plugin 'quitter' from distribution grpo-quitter called sys.exit(5) while being imported" in err, err
    assert "pip uninstall grpo-quitter" in err and "GRPO_DISABLE_PLUGIN_AUTOLOAD=1" in err, err


def test_a_reward_file_whose_import_calls_sys_exit_is_named(tmp_path):
    path = tmp_path / "quits.py"
    path.write_text("import sys\n\nsys.exit(6)\n\n\ndef reward(prompts, completions, **kwargs):\n    return []\n")
    done = run_grpo("train", "quickstart", f'rewards=[{{name="{path}:reward"}}]', "--dry-run", timeout=120)
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr, done.stderr
    assert f"importing '{path}' called sys.exit(6) at {path}:3" in done.stderr, done.stderr
    assert "rewards[0].name" in done.stderr, done.stderr
