"""A finished `grpo train` ends with a short summary: steps, time, reward at the start and the end, the
run directory, and the command that looks at it (which works as printed)."""

from __future__ import annotations

import shlex

import pytest
from tiny_runs import FAST


@pytest.mark.slow
def test_a_finished_run_ends_with_its_summary_and_the_next_command(grpo, tmp_path):
    done = grpo("train", "quickstart", *FAST, "train.output_dir=runs/tiny", "train.torch_threads=1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-3:]
    assert last[0].startswith("done: 2 steps in ") and " s; reward " in last[0] and "at step 2" in last[0], last
    assert last[1] == "run directory runs/tiny (metrics.jsonl, rollouts/, checkpoints/step-2)", last
    assert last[2].startswith("next: grpo inspect runs/tiny   (") and "--rollouts 2" in last[2], last
    command = shlex.split(last[2].removeprefix("next: ").split("   (")[0])
    shown = grpo(*command[1:], "--no-plot", cwd=tmp_path)  # the command as printed, from where it was printed
    assert shown.returncode == 0 and "runs/tiny" in shown.stdout, shown.stderr[-3000:]
