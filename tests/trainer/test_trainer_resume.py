"""Determinism and resume: the same recipe and seed give the same run, and a resumed run equals one
that never stopped (weights, optimizer, learning rate, RNG, data position and moving reference)."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from grpocli.recipe import load_recipe
from grpocli.rundir import RunDir
from grpocli.trainer.checkpoint import _fast_forward
from grpocli.trainer.loop import train

TINY = [
    "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=64", "generation.max_completion_length=8",
    "generation.num_generations=4", "train.prompts_per_step=4", "train.micro_batch_size=8",
    "log.progress=none", "log.rollouts_every=0", "data.args={num_samples=64}",
]
#: Everything that could depend on a restored piece of state (but not on the wall clock).
COMPARED = ("reward", "reward_std", "loss", "grad_norm", "kl", "entropy", "learning_rate",
            "num_tokens", "epoch", "completions/mean_length", "frac_reward_zero_std")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: one thread is fastest, and a busy 2-core machine is not oversubscribed."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _train(out, *overrides: str) -> list[dict]:
    train(load_recipe("quickstart", [*TINY, f"train.output_dir={out}", *overrides]))
    return RunDir(out).read_metrics()


def _untimed(metrics: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith("time/") and not k.endswith("/seconds")
             and k not in ("tokens_per_second", "step_time", "memory/peak")} for m in metrics]


def _assert_same_steps(a: list[dict], b: list[dict], rtol: float = 1e-4) -> None:
    assert [m["step"] for m in a] == [m["step"] for m in b]
    for ma, mb in zip(a, b):
        for key in COMPARED:
            x, y = ma.get(key), mb.get(key)
            assert (x is None) == (y is None), (ma["step"], key, x, y)
            if x is not None:
                assert math.isclose(x, y, rel_tol=rtol, abs_tol=1e-7), (ma["step"], key, x, y)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Six steps in one go (constant learning rate, as in the quickstart)."""
    return _train(tmp_path_factory.mktemp("whole") / "run", "train.steps=6")


@pytest.mark.slow
def test_same_seed_gives_the_same_metrics(uninterrupted, tmp_path):
    again = _train(tmp_path / "again", "train.steps=6")
    assert [m["step"] for m in again] == list(range(1, 7))
    assert _untimed(again) == _untimed(uninterrupted)  # bit-identical, not merely close
    other_seed = _train(tmp_path / "seed1", "train.steps=2", "train.seed=1")
    assert [m["reward"] for m in other_seed] != [m["reward"] for m in uninterrupted[:2]]


@pytest.mark.slow
def test_half_then_resume_equals_one_go(uninterrupted, tmp_path):
    out = tmp_path / "halves"
    first = _train(out, "train.steps=3")
    assert [m["step"] for m in first] == [1, 2, 3]
    assert RunDir(out).latest_checkpoint()[0] == 3
    resumed = _train(out, "train.steps=6")  # resume="auto": continues from checkpoints/step-3
    _assert_same_steps(resumed, uninterrupted)


@pytest.mark.slow
def test_resume_in_a_new_process_restores_schedule_reference_and_cycle(tmp_path, grpo):
    """A linear schedule with warm-up, a moving reference (KL), two optimizer steps per generation
    and two iterations: the state a fresh process needs that the weights alone do not hold."""
    settings = [*TINY, "train.steps=8", "train.save_steps=4", "train.lr_scheduler=linear",
                "train.warmup_steps=2", "algorithm.beta=0.04", "algorithm.ref_sync_steps=2",
                "algorithm.ref_sync_alpha=0.5", "train.steps_per_generation=2", "algorithm.num_iterations=2"]
    whole = _train(tmp_path / "whole", *settings)
    assert (tmp_path / "whole/checkpoints/step-4/trainer/reference.safetensors").exists()
    # as if it had crashed after step 6: step-4 is the newest complete checkpoint
    shutil.copytree(tmp_path / "whole", tmp_path / "crashed")
    shutil.rmtree(tmp_path / "crashed/checkpoints/step-8")
    result = grpo("train", "quickstart", *settings, f"train.output_dir={tmp_path / 'crashed'}",
                  env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = RunDir(tmp_path / "crashed").read_metrics()
    _assert_same_steps(resumed, whole)
    assert any(m.get("kl", 0) > 0 for m in whole[4:])  # the reference did matter after the resume point


def test_tmp_checkpoint_is_never_the_latest(tmp_path):
    run = RunDir(tmp_path)
    (run.checkpoint(2) / "trainer").mkdir(parents=True)
    (run.checkpoints / "step-5.tmp" / "trainer").mkdir(parents=True)
    (run.checkpoints / "step-5.tmp" / "trainer" / "state.json").write_text(json.dumps({"step": 5}))
    assert run.latest_checkpoint() == (2, run.checkpoint(2))
    assert [step for step, _ in run.list_checkpoints()] == [2]


def test_a_finished_run_is_not_trained_again(tmp_path):
    from safetensors.torch import save_file

    from grpocli.errors import UserError
    from grpocli.rundir import resume_point

    run = RunDir(tmp_path)
    (run.checkpoint(4) / "trainer").mkdir(parents=True)
    (run.checkpoint(4) / "trainer" / "state.json").write_text(json.dumps({"step": 4}))
    # the files resume checks before it trusts a checkpoint (grpocli.rundir.checkpoint_problems)
    (run.checkpoint(4) / "config.json").write_text("{}")
    save_file({"w": torch.zeros(1)}, str(run.checkpoint(4) / "model.safetensors"))
    for name in ("optimizer.pt", "scheduler.pt", "rng-rank0.pt"):
        torch.save({}, run.checkpoint(4) / "trainer" / name)
    assert resume_point(run, "auto", 6) == (4, run.checkpoint(4))
    with pytest.raises(UserError, match="already complete"):
        resume_point(run, "auto", 4)


def test_learning_rate_follows_the_resumed_schedule():
    """Resuming with a larger train.steps decays over the new length from the checkpoint's step."""
    from transformers import get_scheduler

    def fresh(total: int):
        opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
        return opt, get_scheduler("linear", opt, num_warmup_steps=2, num_training_steps=total)

    opt, sched = fresh(10)
    opt.param_groups[0]["lr"] = 0.0  # what a finished 4-step run's optimizer state would hold
    _fast_forward(sched, 4)
    assert sched.last_epoch == 4
    assert math.isclose(opt.param_groups[0]["lr"], 1e-3 * (10 - 4) / (10 - 2))
    assert math.isclose(sched.get_last_lr()[0], opt.param_groups[0]["lr"])
