"""Damaged checkpoints, on real files of a real tiny run: resume and `grpo eval` check a checkpoint
before using it, skip a damaged newest one with a warning that names it and why, stop (exit 2)
when none is intact or a damaged one is named, and say so when a checkpoint is pruned while
`grpo eval` reads it (not "hf download")."""

from __future__ import annotations

import io
import json
import os
import textwrap
from pathlib import Path

import pytest
import torch
from cli_runner import run_grpo
from rich.console import Console
from tiny_runs import FAST, TINY_MODEL

from grpocli.errors import UserError
from grpocli.recipe import load_recipe
from grpocli.rundir import RunDir, resume_point
from grpocli.trainer.loop import train

#: The tiny run, 4 steps with a checkpoint every 2: step-2 and step-4.
RUN = [*FAST, "train.steps=4", "train.save_steps=2"]  # as conftest.py trained it
#: `grpo eval` on the tiny model: 2 prompts x 2 samples of 4 tokens.
EVAL = ["--n", "2", "--k", "1", "--num-prompts", "2", "--max-tokens", "4"]
EVAL_OVERRIDES = [*TINY_MODEL, "data.args={num_samples=64}"]


def _truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def _corrupt_state(path: Path) -> None:
    path.write_text('{"step": 4, "position"', encoding="utf-8")  # a write cut short


#: How the newest checkpoint is damaged, the file it touches, and what the warning must say.
DAMAGE = {
    "truncated weights": ("model.safetensors", _truncate, "model.safetensors is damaged"),
    "missing weights": ("model.safetensors", Path.unlink, "model.safetensors is missing"),
    "corrupt state": ("trainer/state.json", _corrupt_state, "trainer/state.json cannot be read"),
    "missing RNG": ("trainer/rng-rank0.pt", Path.unlink, "trainer/rng-rank0.pt is missing"),
    "truncated optimizer": ("trainer/optimizer.pt", _truncate, "trainer/optimizer.pt is damaged"),
}






def _damage(run: Path, step: int, how: str) -> None:
    name, damage, _ = DAMAGE[how]
    damage(run / "checkpoints" / f"step-{step}" / name)


@pytest.mark.slow
@pytest.mark.parametrize("how", list(DAMAGE))
def test_resume_skips_a_damaged_newest_checkpoint(run_copy, how, capsys):
    _damage(run_copy, 4, how)
    step, path = resume_point(RunDir(run_copy), "auto", steps=6)
    assert (step, path.name) == (2, "step-2")
    warning = capsys.readouterr().err
    assert "warning: skipping the damaged checkpoint" in warning
    assert str(run_copy / "checkpoints" / "step-4") in warning and DAMAGE[how][2] in warning
    assert "resuming from step-2" in warning


@pytest.mark.slow
def test_resume_with_no_intact_checkpoint_names_each_and_why(run_copy):
    _damage(run_copy, 4, "truncated weights")
    _damage(run_copy, 2, "missing RNG")
    with pytest.raises(UserError) as err:
        resume_point(RunDir(run_copy), "auto", steps=6)
    text = err.value.render()
    assert err.value.where == "train.resume"
    assert "step-4: model.safetensors is damaged" in text and "step-2: trainer/rng-rank0.pt is missing" in text
    assert "train.output_dir=" in text  # what to run next


@pytest.mark.slow
def test_resume_from_a_named_damaged_checkpoint_says_what_is_wrong(run_copy):
    _damage(run_copy, 4, "corrupt state")
    with pytest.raises(UserError) as err:
        resume_point(RunDir(run_copy), str(run_copy / "checkpoints" / "step-4"), steps=6)
    assert "step-4 is damaged: trainer/state.json cannot be read" in err.value.what
    assert str(run_copy / "checkpoints" / "step-2") in err.value.valid  # the intact one


@pytest.fixture
def one_thread():
    """Tiny matrices: one thread is fastest, and a busy 2-core machine is not oversubscribed."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_train_resumes_from_the_newest_intact_checkpoint(run_copy, one_thread, capfd):
    """`grpo train` on a run whose step-4 weights are truncated trains on from step-2."""
    _damage(run_copy, 4, "truncated weights")
    train(load_recipe("quickstart", [*RUN, "train.steps=6", f"train.output_dir={run_copy}"]))
    err = capfd.readouterr().err
    assert "skipping the damaged checkpoint" in err and "resuming from step-2" in err
    run = RunDir(run_copy)
    assert [m["step"] for m in run.read_metrics() if "loss" in m] == [1, 2, 3, 4, 5, 6]
    assert [s for s, _ in run.list_checkpoints()] == [2, 4, 6]
    assert not run.newest_intact(resume=True)[1]  # step-4 was written again, whole


@pytest.mark.slow
def test_eval_of_a_run_takes_its_newest_intact_checkpoint(run_copy, one_thread, capfd):
    """`grpo eval --checkpoint RUN` on a run whose newest weights are truncated."""
    from grpocli.evaluation.eval_run import run_eval

    _damage(run_copy, 4, "truncated weights")
    summaries = run_eval("quickstart", EVAL_OVERRIDES, checkpoints=[str(run_copy)], n=2, k="1", num_prompts=2,
                         max_tokens=4, console=Console(file=io.StringIO()))
    assert list(summaries) == ["step-2"]
    err = capfd.readouterr().err
    assert "newest intact checkpoint step-2" in err
    assert "skipped the damaged step-4: model.safetensors is damaged" in err
    summary = json.loads((run_copy / "eval" / "step-2-test" / "summary.json").read_text())
    assert summary["model"] == str(run_copy / "checkpoints" / "step-2")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["truncated weights", "missing weights"])
def test_eval_of_a_named_damaged_checkpoint_is_exit_2(run_copy, how):
    _damage(run_copy, 4, how)
    result = run_grpo("eval", "quickstart", "--checkpoint", str(run_copy / "checkpoints" / "step-4"), *EVAL)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert f"the checkpoint {run_copy / 'checkpoints' / 'step-4'} is damaged: {DAMAGE[how][2]}" in result.stderr
    assert f"intact checkpoints of this run: {run_copy / 'checkpoints' / 'step-2'}" in result.stderr


@pytest.mark.slow
def test_eval_says_a_checkpoint_was_pruned_while_it_read_it(run_copy, tmp_path, monkeypatch):
    """A run still training prunes old checkpoints (train.save_total_limit): here a reward that
    runs while step-2 is evaluated removes step-4 before `grpo eval` loads it."""
    from grpocli.evaluation.eval_run import run_eval

    step4 = run_copy / "checkpoints" / "step-4"
    (tmp_path / "pruner.py").write_text(textwrap.dedent(f"""
        import shutil

        def prune(prompts, completions, **kwargs):
            shutil.rmtree({str(step4)!r}, ignore_errors=True)
            return [0.0] * len(completions)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError) as err:
        run_eval("quickstart", [*EVAL_OVERRIDES, 'rewards=[{name="pruner:prune"}]'],
                 checkpoints=[str(run_copy / "checkpoints" / "step-2"), str(step4)], n=2, k="1", num_prompts=1,
                 max_tokens=4, console=Console(file=io.StringIO()))
    text = err.value.render()
    assert f"the checkpoint {step4} was removed while grpo eval was reading it" in text
    assert "train.save_total_limit" in text and "hf download" not in text
    assert "checkpoints of the run now: step-2" in text
    assert not os.path.exists(step4)
