"""Processes that wait for each other never hang silently (2 gloo processes on the CPU; the same
under NCCL on 2 GPUs, marker gpu2; tiny model):

- a process whose groups are all flat (nothing to compute) still joins the gradient all-reduce
  through the DDP wrapper; before, it ran a backward without a DDP forward, skipped the
  all-reduce, and the run hung at step 1 with no output;
- a collective that waits past train.collective_timeout (here a reward that takes 30 s on one
  process) stops the run with exit 2, naming the step and what each process was doing.
"""

from __future__ import annotations

import json

import pytest
from cli_runner import run_grpo
from tiny_runs import FAST

REWARDS = '''
import os
import time


def flat_on_one(prompts, completions, **kwargs):
    """Constant on process 1 (every group flat there), the completion length on process 0."""
    if os.environ.get("RANK") == "1":
        return [0.0] * len(completions)
    return [float(len(c)) for c in completions]


def slow_on_one(prompts, completions, **kwargs):
    """Process 1 takes 30 s over its first batch; process 0 answers at once."""
    if os.environ.get("RANK") == "1" and not os.path.exists(os.environ["SLOW_MARK"]):
        open(os.environ["SLOW_MARK"], "w").close()
        time.sleep(30)
    return [float(len(c)) for c in completions]
'''


@pytest.fixture
def rewards(tmp_path):
    path = tmp_path / "rank_rewards.py"
    path.write_text(REWARDS)
    return path


@pytest.mark.slow
def test_a_process_with_only_flat_groups_keeps_the_others_going(tmp_path, rewards):
    out = tmp_path / "run"
    done = run_grpo("train", "quickstart", *FAST, "train.num_processes=2", "train.collective_timeout=60",
                    f'rewards=[{{name="{rewards}:flat_on_one"}}]', f"train.output_dir={out}",
                    env={"OMP_NUM_THREADS": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["frac_reward_zero_std"] == 0.5 for m in metrics)  # process 1's half of the groups
    assert all(m["grad_norm"] > 0 for m in metrics)                # process 0's groups trained


@pytest.mark.slow
def test_a_collective_past_its_timeout_stops_the_run_naming_each_process(tmp_path, rewards):
    out = tmp_path / "run"
    done = run_grpo("train", "quickstart", *FAST, "train.num_processes=2", "train.collective_timeout=5",
                    f'rewards=[{{name="{rewards}:slow_on_one"}}]', f"train.output_dir={out}",
                    env={"OMP_NUM_THREADS": "1", "SLOW_MARK": str(tmp_path / "slow")}, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    err = done.stderr
    assert "Traceback" not in err and err.count("error: train.collective_timeout") == 1, err[-3000:]
    assert "stopped waiting for each other at step 1" in err and "more than 5 s" in err
    assert "process 0 was at: advantages" in err   # waiting in the gather of every process's rewards
    assert "process 1: step 1, rewards" in err     # the one that was slow
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())


@pytest.mark.gpu2
def test_under_nccl_an_idle_process_and_a_collective_timeout(tmp_path, rewards):
    """The two cases above on 2 GPUs: NCCL hangs where gloo aborts, so both matter most there."""
    env = {"OMP_NUM_THREADS": "1", "SLOW_MARK": str(tmp_path / "slow")}
    done = run_grpo("train", "quickstart", *FAST, "train.num_processes=2", "train.collective_timeout=60",
                    f'rewards=[{{name="{rewards}:flat_on_one"}}]', f"train.output_dir={tmp_path / 'flat'}",
                    env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    done = run_grpo("train", "quickstart", *FAST, "train.num_processes=2", "train.collective_timeout=5",
                    f'rewards=[{{name="{rewards}:slow_on_one"}}]', f"train.output_dir={tmp_path / 'slow'}",
                    env=env, timeout=120)
    assert done.returncode == 2 and "process 1: step 1, rewards" in done.stderr, done.stderr[-3000:]
