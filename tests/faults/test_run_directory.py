"""What a run directory keeps, whatever the run meets: a reward that changes the working directory,
a resume with a changed recipe, a directory holding metrics but no checkpoint, SIGTERM and SIGINT.

Each test runs the real `grpo train` in a subprocess on the tiny model and reads the run directory
it leaves.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import run_grpo
from tiny_runs import FAST

ENV = {"OMP_NUM_THREADS": "1"}

MOVES = '''
import os

def moves_away(prompts, completions, **kwargs):
    os.chdir({elsewhere!r})  # as rewards that run code in a scratch directory often do
    return [float(len(c)) for c in completions]
'''


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_reward_that_changes_directory_does_not_move_the_run(tmp_path):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir(), elsewhere.mkdir()
    reward = tmp_path / "moving.py"
    reward.write_text(MOVES.format(elsewhere=str(elsewhere)))
    args = ["train", "quickstart", *FAST, f'rewards=[{{name="{reward}:moves_away"}}]', "train.save_steps=1",
            "train.output_dir=runs/moved"]
    done = run_grpo(*args, cwd=home, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    run = home / "runs" / "moved"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-1", "step-2"]
    assert (run / "config.resolved.toml").is_file() and (run / "rollouts" / "step-2.jsonl").is_file()
    assert _steps(run) == [1, 2]
    assert list(elsewhere.iterdir()) == []  # nothing written where the reward went
    first = (run / "metrics.jsonl").read_text()

    again = run_grpo(*args, "train.steps=3", cwd=home, env=ENV, timeout=300)  # the same command, one step more
    assert again.returncode == 0, again.stderr[-3000:]
    assert _steps(run) == [1, 2, 3]
    assert (run / "metrics.jsonl").read_text().startswith(first)  # resumed at step 2, not redone from 0
    assert list(elsewhere.iterdir()) == []
