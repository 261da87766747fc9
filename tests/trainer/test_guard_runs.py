"""train.guard in real tiny runs: an exploding learning rate (a reward that sets the optimizer's learning
rate to inf at a given step, once: tests/trainer/data/guard_faults.py, which also returns NaN rewards,
which trip nothing) rolls the run back to its last checkpoint, exactly where a resume would start, or stops
it with exit 2; a KL past max_kl and a collapsed entropy with action 'skip' are noted and the run goes on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from cli_runner import assert_user_error

from grpocli.inspection.run_summary import summary_lines
from grpocli.recipe import load_recipe
from grpocli.rundir import RunDir, read_jsonl
from grpocli.trainer.loop import train
from grpocli.trainer.session import TrainingStopped

FAULTS = Path(__file__).resolve().parent / "data" / "guard_faults.py"
#: Two optimizer steps per generation: the update after the explosion is the cycle's second, so the NaN it
#: makes is seen (and rolled back) before the next generation samples from the broken weights.
TINY = [
    "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=64", "generation.max_completion_length=8", "generation.num_generations=4",
    "train.prompts_per_step=4", "train.micro_batch_size=8", "train.steps_per_generation=2", "log.progress=none",
    "log.rollouts_every=1", "data.args={num_samples=64}", "train.save_steps=2",
]


def _exploding(at_step: int, once: Path) -> str:
    return (f'rewards=[{{name="length", args={{target=8}}}}, {{name="{FAULTS}:explode", '
            f'args={{at_step={at_step}, once="{once}"}}}}]')


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: one thread is fastest, and a busy 2-core machine is not oversubscribed."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _train(out: Path, *overrides: str) -> RunDir:
    train(load_recipe("quickstart", [*TINY, f"train.output_dir={out}", *overrides]))
    return RunDir(out)


def _rollouts(run: RunDir | Path, step: int) -> list[tuple[str, str]]:
    path = run.rollout_file(step) if isinstance(run, RunDir) else run / f"step-{step}.jsonl"
    return [(row["prompt"], row["completion"]) for row in read_jsonl(path)]


@pytest.fixture(scope="module")
def rolled_back(tmp_path_factory):
    """Six steps; the reward makes step 3's update explode (lr = inf), step 4's loss is NaN: back to step 2."""
    root = tmp_path_factory.mktemp("rollback")
    settings = ["train.steps=6", "train.guard.action=rollback", _exploding(2, root / "exploded")]
    return _train(root / "run", *settings), settings, root / "exploded"


@pytest.mark.slow
def test_rollback_finishes_and_keeps_the_undone_steps_aside(rolled_back):
    run = rolled_back[0]
    rows = run.read_metrics()
    assert [r["step"] for r in rows] == [1, 2, 2, 3, 4, 5, 6]  # one curve, from the checkpoint's step on
    assert rows[2] == {"step": 2, "guard/rollback": 1, "guard/rolled_back_from": 4, "guard/lr_scale": 0.5}
    assert [r["learning_rate"] for r in rows if "learning_rate" in r] == [1e-3, 1e-3, 5e-4, 5e-4, 5e-4, 5e-4]
    assert not any("guard/tripped" in r for r in rows)  # the NaN rewards tripped nothing
    folder = run.discarded / "rollback-1"
    undone = read_jsonl(folder / "metrics.jsonl")
    assert [r["step"] for r in undone] == [3, 4] and undone[1]["loss"] is None and undone[1]["guard/tripped"] == 1
    assert sorted(p.name for p in (folder / "rollouts").iterdir()) == ["step-3.jsonl", "step-4.jsonl"]
    said = json.loads((folder / "rollback.json").read_text())
    assert (said["at_step"], said["to_step"], said["metric"], said["lr_scale"]) == (4, 2, "loss", 0.5)
    assert [s for s, _ in run.list_checkpoints()] == [2, 4, 6]
    state = json.loads((run.checkpoint(4) / "trainer" / "state.json").read_text())
    assert state["lr_scale"] == 0.5  # a resume from a later checkpoint keeps the lowered learning rate
    lines = summary_lines(run.root, 1.0)
    assert any(line.startswith("rolled back at step 4 to step 2, lr x0.5 (the loss is nan") for line in lines), lines
    # the steps redone from the checkpoint drew the same batch as the undone ones: the same random state
    for step in (3, 4):
        assert _rollouts(folder / "rollouts", step) == _rollouts(run, step)


@pytest.mark.slow
def test_rollback_continues_as_a_resume_from_its_checkpoint_would(rolled_back, tmp_path):
    run, settings, _ = rolled_back  # the reward does not explode again: its marker file is there
    shutil.copytree(run.root, tmp_path / "resumed", ignore=shutil.ignore_patterns("discarded", "step-4", "step-6"))
    resumed = _train(tmp_path / "resumed", *settings)  # resume="auto": from checkpoints/step-2, lr x1
    for step in range(3, 7):  # the same prompts in the same order after the rollback as after a resume
        assert [p for p, _ in _rollouts(resumed, step)] == [p for p, _ in _rollouts(run, step)], step
    # and the first cycle after it sampled the same completions: weights and random state as the resume's
    assert _rollouts(resumed, 3) == _rollouts(run, 3) and _rollouts(resumed, 4) == _rollouts(run, 4)


@pytest.mark.slow
def test_a_resume_after_a_rollback_keeps_the_lowered_learning_rate(rolled_back, tmp_path):
    run, settings, _ = rolled_back
    shutil.copytree(run.root, tmp_path / "crashed", ignore=shutil.ignore_patterns("step-6"))  # as if killed at 6
    resumed = _train(tmp_path / "crashed", *settings).read_metrics()  # from checkpoints/step-4 (lr_scale 0.5)
    assert [(r["step"], r["learning_rate"]) for r in resumed[-2:]] == [(5, 5e-4), (6, 5e-4)]


@pytest.mark.slow
def test_stop_exits_2_naming_the_step_the_metric_and_the_key(grpo, tmp_path):
    out = tmp_path / "run"
    result = grpo("train", "quickstart", *TINY, "train.steps=2", f"train.output_dir={out}", "train.guard.action=stop",
                  _exploding(0, tmp_path / "exploded"), env={"OMP_NUM_THREADS": "1"})
    err = assert_user_error(result, "train.guard.action: the loss is nan (not finite), at step 2",
                            "the run stops (train.guard.action = 'stop')", "no checkpoint was written yet")
    assert "valid: a finite loss" in err and "train.guard.action=rollback" in err
    assert [r["step"] for r in RunDir(out).read_metrics()] == [1, 2]  # the bad step's line is kept


@pytest.mark.slow
def test_rollback_before_any_checkpoint_stops_saying_so(tmp_path):
    with pytest.raises(TrainingStopped) as caught:
        _train(tmp_path / "run", "train.steps=2", "train.save_steps=4", "train.guard.action=rollback",
               _exploding(0, tmp_path / "exploded"))
    assert caught.value.exit_code == 2
    assert "there is no checkpoint before step 2 to roll back to (train.save_steps = 4)" in str(caught.value)


@pytest.mark.slow
def test_skip_notes_a_kl_and_an_entropy_trip_and_goes_on(tmp_path, capsys):
    run = _train(tmp_path / "run", "train.steps=2", "train.steps_per_generation=1", "algorithm.beta=0.04",
                 "train.guard.max_kl=1e-12", "train.guard.min_entropy=50", "train.guard.entropy_patience=1")
    rows = run.read_metrics()
    assert [(r["step"], r.get("guard/tripped")) for r in rows] == [(1, 1.0), (2, 1.0)]
    err = capsys.readouterr().err
    assert "step 1: entropy" in err and "has been below train.guard.min_entropy = 50" in err  # kl is 0 at step 1
    assert "step 2: kl" in err and "is above train.guard.max_kl = 1e-12; the update stays and training goes on" in err
