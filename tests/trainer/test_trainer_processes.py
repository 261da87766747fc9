"""Data-parallel training on CPU: `train.num_processes=2` relaunches under accelerate (torchrun,
gloo); group statistics cover every process's groups and the replicas keep identical weights."""

from __future__ import annotations

import json
import math
from collections import defaultdict

import pytest
import torch

from grpocli.recipe import load_recipe
from grpocli.rundir import RunDir
from grpocli.trainer.launch import LAUNCHED, _inside_launch, launch_command

STEPS = 3
SETTINGS = [
    "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=64", "generation.max_completion_length=8",
    "generation.num_generations=4", "train.prompts_per_step=4", "log.progress=none",
    "log.rollouts_every=1", "data.args={num_samples=64}", f"train.steps={STEPS}",
    "train.save_steps=1", "train.num_processes=2",
]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    from cli_runner import run_grpo

    out = tmp_path_factory.mktemp("ddp") / "run"
    result = run_grpo("train", "quickstart", *SETTINGS, f"train.output_dir={out}",
                      env={"OMP_NUM_THREADS": "1"}, timeout=400)
    assert result.returncode == 0, result.stderr[-4000:]
    return RunDir(out), result


@pytest.mark.slow
def test_one_metrics_line_per_step_and_state_per_rank(two_processes):
    run, result = two_processes
    assert [m["step"] for m in run.read_metrics()] == list(range(1, STEPS + 1))
    trainer = run.checkpoint(STEPS) / "trainer"
    assert (trainer / "rng-rank0.pt").exists() and (trainer / "rng-rank1.pt").exists()
    # save_checkpoint compares a fingerprint of both replicas' weights at every save (save_steps=1)
    assert [step for step, _ in run.list_checkpoints()] == list(range(1, STEPS + 1))
    assert "Writing model shards" not in result.stderr + result.stdout


@pytest.mark.slow
def test_group_statistics_cover_both_processes(two_processes):
    run, _ = two_processes
    for m in run.read_metrics():
        rows = [json.loads(line) for line in run.rollout_file(m["step"]).read_text().splitlines()]
        assert len(rows) == 4 * 4  # every process's 2 groups x 4 completions
        groups: dict[int, list[dict]] = defaultdict(list)
        for row in rows:
            groups[row["group"]].append(row)
        assert sorted(groups) == [0, 1, 2, 3] and all(len(g) == 4 for g in groups.values())
        assert len({g[0]["prompt"] for g in groups.values()}) == 4  # the ranks drew different prompts
        rewards = torch.tensor([row["reward"] for row in rows])
        assert math.isclose(m["reward"], float(rewards.mean()), rel_tol=1e-6, abs_tol=1e-7)
        assert math.isclose(m["reward_std"], float(rewards.std()), rel_tol=1e-5, abs_tol=1e-7)
        zero = [len({row["reward"] for row in g}) == 1 for g in groups.values()]
        assert math.isclose(m["frac_reward_zero_std"], sum(zero) / 4)
        for g in groups.values():  # group-relative advantages, whichever process held the group
            assert abs(sum(row["advantage"] for row in g)) < 1e-4


def test_launched_processes_do_not_launch_again(monkeypatch):
    for key in (LAUNCHED, "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    assert not _inside_launch()
    monkeypatch.setenv(LAUNCHED, "1")
    assert _inside_launch()
    resolved = load_recipe("quickstart", ["train.num_processes=2"])
    cmd = launch_command(resolved, ["train.num_processes=2"], 2)
    # accelerate's --cpu launcher starts one process; --multi_gpu (torchrun) starts n, on CPU too
    assert "--multi_gpu" in cmd and "--cpu" not in cmd
    assert cmd[cmd.index("--num_processes") + 1] == "2" and cmd[-1] == "train.num_processes=2"


def test_a_finished_run_fails_once_before_launching(tmp_path, monkeypatch):
    from grpocli.errors import UserError
    from grpocli.trainer.launch import launch

    for key in (LAUNCHED, "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    run = RunDir(tmp_path / "run")
    (run.checkpoint(3) / "trainer").mkdir(parents=True)
    (run.checkpoint(3) / "trainer" / "state.json").write_text(json.dumps({"step": 3}))
    overrides = ["train.num_processes=2", "train.steps=3", f"train.output_dir={run.root}"]
    with pytest.raises(UserError, match="already complete"):  # raised here, not in 2 children
        launch(load_recipe("quickstart", overrides), overrides)
