"""Data-parallel training on CPU: `train.num_processes=2` relaunches under accelerate (torchrun,
gloo); group statistics cover every process's groups and the replicas keep identical weights.
`accelerate launch --cpu --num_processes 2` runs two processes too, and the run records the
process count and mixed precision that ran (see grpocli/launch/launcher.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import defaultdict

import pytest
import tomllib
import torch

from grpocli.launch.launcher import LAUNCHED, _inside_launch, launch_command
from grpocli.recipe import load_recipe
from grpocli.rundir import RunDir

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
    assert _ran(run) == (2, "no")
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
    import torch
    from safetensors.torch import save_file

    from grpocli.errors import UserError
    from grpocli.launch.launcher import launch

    for key in (LAUNCHED, "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    run = RunDir(tmp_path / "run")
    (run.checkpoint(3) / "trainer").mkdir(parents=True)
    (run.checkpoint(3) / "trainer" / "state.json").write_text(json.dumps({"step": 3}))
    # the files resume checks before it trusts a checkpoint (grpocli.rundir.checkpoint_problems)
    (run.checkpoint(3) / "config.json").write_text("{}")
    save_file({"w": torch.zeros(1)}, str(run.checkpoint(3) / "model.safetensors"))
    for name in ("optimizer.pt", "scheduler.pt", "rng-rank0.pt"):
        torch.save({}, run.checkpoint(3) / "trainer" / name)
    overrides = ["train.num_processes=2", "train.steps=3", f"train.output_dir={run.root}"]
    with pytest.raises(UserError, match="already complete"):  # raised here, not in 2 children
        launch(load_recipe("quickstart", overrides), overrides, not_here)


def not_here(resolved) -> None:
    """The training function for launches that must not train in this process."""
    raise AssertionError("launch trained in this process")


# -- accelerate launch ------------------------------------------------------------------------
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch"]
GRPO = ["-m", "grpocli.cli.app", "train", "quickstart"]
LAUNCHER_ENV = ("ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_CPU", "MASTER_ADDR", "MASTER_PORT",
                "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "RANK")


def _ran(run: RunDir) -> tuple[int, str]:
    train = tomllib.loads(run.config.read_text())["train"]
    return train["num_processes"], train["mixed_precision"]


def _accelerate(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    from cli_runner import ROOT

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    for key in (LAUNCHED, "WORLD_SIZE", "LOCAL_RANK", *LAUNCHER_ENV):
        env.pop(key, None)
    return subprocess.run([*ACCELERATE, *args], check=False, capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=timeout)


@pytest.fixture
def under_accelerate(monkeypatch):
    """This process as accelerate's one-process launcher starts it (`accelerate launch --cpu ...`)."""
    from grpocli.launch import launcher as launch_module
    from grpocli.launch import request as request_module

    for key in (LAUNCHED, "WORLD_SIZE", "LOCAL_RANK", *LAUNCHER_ENV):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")

    def parent(*args: str) -> None:
        argv = ["/venv/bin/python", "/venv/bin/accelerate", "launch", *args, *GRPO] if args else None
        monkeypatch.setattr(request_module, "_parent_argv", lambda: argv)

    started: list = []
    monkeypatch.setattr(launch_module, "_accelerate_launch",
                        lambda resolved, overrides, n: started.append((n, overrides)) or 0)
    return parent, started


@pytest.mark.slow
def test_accelerate_launch_cpu_runs_two_processes(tmp_path):
    out = tmp_path / "run"
    steps = ["train.steps=2", "train.save_steps=0"]
    result = _accelerate("--cpu", "--num_processes", "2", "--mixed_precision", "bf16", *GRPO,
                         *SETTINGS[:-3], *steps, f"train.output_dir={out}")
    assert result.returncode == 0, result.stderr[-4000:]
    run = RunDir(out)
    assert _ran(run) == (2, "bf16")  # the processes that ran; accelerate's mixed precision, honoured
    assert [m["step"] for m in run.read_metrics()] == [1, 2]
    assert (run.checkpoint(2) / "trainer" / "rng-rank1.pt").exists()
    assert "starting 2 through `accelerate launch --multi_gpu`" in result.stderr


def test_mixed_precision_conflict_is_named(tmp_path):
    out = tmp_path / "run"
    result = _accelerate("--cpu", "--quiet", "--mixed_precision", "fp16", *GRPO, "train.mixed_precision=bf16",
                         f"train.output_dir={out}", timeout=120)
    assert result.returncode != 0
    assert "train.mixed_precision = 'bf16' (argument" in result.stderr
    assert "accelerate's mixed precision is 'fp16' (accelerate launch --mixed_precision fp16)" in result.stderr
    assert "Traceback" not in result.stderr and not out.exists()


def test_mixed_precision_conflict_exits_2(grpo, tmp_path):
    result = grpo("train", "quickstart", "train.mixed_precision=bf16", f"train.output_dir={tmp_path / 'run'}",
                  env={"ACCELERATE_MIXED_PRECISION": "fp16"})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "'bf16'" in result.stderr and "'fp16' (ACCELERATE_MIXED_PRECISION=fp16)" in result.stderr


@pytest.mark.parametrize(("accelerate_args", "overrides", "used"), [
    ((), [], "no"),
    (("--mixed_precision", "bf16"), [], "bf16"),                          # only accelerate set it
    (("--mixed_precision", "bf16"), ["train.mixed_precision=bf16"], "bf16"),  # both, the same
    ((), ["train.mixed_precision=bf16"], "bf16"),                        # accelerate's "no" is its default
    (("--mixed_precision", "no"), ["train.mixed_precision=bf16"], None),  # both set, different
    (("--mixed_precision", "fp16"), ["train.mixed_precision=no"], None),
])
def test_mixed_precision_rule(under_accelerate, monkeypatch, accelerate_args, overrides, used):
    from grpocli.errors import UserError
    from grpocli.launch.request import accelerate_request, settle_mixed_precision

    parent, _ = under_accelerate
    parent(*accelerate_args, "--cpu")
    flag = accelerate_args[1] if accelerate_args else "no"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", flag)
    resolved = load_recipe("quickstart", overrides)
    if used is None:
        with pytest.raises(UserError, match="accelerate launch --mixed_precision"):
            settle_mixed_precision(resolved, accelerate_request())
    else:
        assert settle_mixed_precision(resolved, accelerate_request()).recipe.train.mixed_precision == used


def test_accelerate_command_lines_are_read(tmp_path):
    from grpocli.launch.request import _accelerate_argv, accelerate_request

    tail = ["--cpu", "--num_processes", "2", *GRPO]
    for head in (["python", "-m", "accelerate.commands.launch"], ["/v/bin/python", "/v/bin/accelerate", "launch"],
                 ["/v/bin/python", "/v/bin/accelerate-launch"]):
        assert _accelerate_argv([*head, *tail]) == tail
    assert _accelerate_argv(["python", "-m", "pytest", "launch"]) is None
    request = accelerate_request(tail)
    assert (request.num_processes, request.mixed_precision_flag) == (2, False)
    config = tmp_path / "accelerate.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nmixed_precision: bf16\n"
                      "num_machines: 1\nnum_processes: 4\nuse_cpu: true\n")
    request = accelerate_request(["--config_file", str(config), *GRPO])
    assert request.num_processes == 4 and request.mixed_precision_from == f"accelerate config file {config}"


def test_one_process_launcher_asked_for_two_starts_two(under_accelerate, tmp_path):
    from grpocli.launch.launcher import launch

    parent, started = under_accelerate
    parent("--cpu", "--num_processes", "2")
    overrides = [f"train.output_dir={tmp_path / 'run'}"]
    launch(load_recipe("quickstart", overrides), overrides, not_here)  # they ended with 0: it returns (a summary next)
    assert started == [(2, [*overrides, "train.num_processes=2"])]


def test_one_process_launcher_unreadable_stops_with_the_commands_that_work(under_accelerate, monkeypatch):
    from grpocli.errors import UserError
    from grpocli.launch.launcher import launch

    parent, started = under_accelerate
    parent()  # its command line cannot be read; it set MASTER_ADDR: asked for several processes
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.raises(UserError) as error:
        launch(load_recipe("quickstart", ["train.steps=3"]), ["train.steps=3"], not_here)
    hint = error.value.render()
    assert "grpo train quickstart train.steps=3 train.num_processes=N" in hint
    assert "accelerate launch --multi_gpu --num_processes N -m grpocli.cli.app train quickstart" in hint
    assert started == []


def test_one_process_launcher_on_several_machines_stops(under_accelerate):
    from grpocli.errors import UserError
    from grpocli.launch.launcher import launch

    parent, started = under_accelerate
    parent("--cpu", "--num_machines", "2", "--num_processes", "4")
    with pytest.raises(UserError, match="--multi_gpu --num_machines 2"):
        launch(load_recipe("quickstart", []), [], not_here)
    assert started == []


def test_launched_processes_take_the_launchers_count():
    from grpocli.errors import UserError
    from grpocli.launch.launcher import _adopt_world_size

    resolved = _adopt_world_size(load_recipe("quickstart", ["train.prompts_per_step=4"]), 2)
    assert resolved.recipe.train.num_processes == 2
    with pytest.raises(UserError, match="prompts_per_step = 3 must divide evenly over the 2 processes"):
        _adopt_world_size(load_recipe("quickstart", ["train.prompts_per_step=3"]), 2)


def test_one_process_launcher_on_one_gpu_stops(under_accelerate, monkeypatch):
    from grpocli.errors import UserError
    from grpocli.launch import launcher as launch_module

    parent, started = under_accelerate
    parent("--num_processes", "2")  # no --cpu: accelerate starts one process per GPU
    monkeypatch.setenv("ACCELERATE_USE_CPU", "False")
    monkeypatch.setattr(launch_module, "_visible_gpus", lambda: 1)
    with pytest.raises(UserError, match="accelerate launch --cpu --num_processes 2 -m grpocli.cli.app train"):
        launch_module.launch(load_recipe("quickstart", []), [], not_here)
    assert started == []


def test_a_recipe_for_two_processes_launched_on_four_says_the_prompts_each_gives(capsys, monkeypatch):
    """`grpo import trl --num-processes 2` writes train.num_processes = 2; torchrun with 4 keeps grpo's step."""
    from grpocli.launch import launcher
    from grpocli.recipe import load_recipe

    monkeypatch.setenv("RANK", "0")
    resolved = load_recipe(None, ["train.num_processes=2", "train.prompts_per_step=8"])
    adopted = launcher._adopt_world_size(resolved, 4)
    assert adopted.recipe.train.num_processes == 4 and adopted.recipe.train.prompts_per_step == 8
    said = capsys.readouterr().err
    assert "train.prompts_per_step = 8 prompts over all 4 processes (2 each)" in said
    assert "would give 16 on 4: set train.prompts_per_step=16 for TRL's" in said
