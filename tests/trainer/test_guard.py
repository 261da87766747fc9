"""train.guard without a model: which steps trip it (the Watchdog), which settings are refused when the
recipe loads, and what a rollback moves aside and says at the end. The real runs: test_guard_runs.py."""

from __future__ import annotations

import json
import math

import pytest
from cli_runner import assert_user_error

from grpocli.errors import UserError
from grpocli.inspection.run_summary import summary_lines
from grpocli.recipe import load_recipe
from grpocli.recipe.guard_section import GuardSection
from grpocli.rundir import RunDir
from grpocli.trainer.guard import Watchdog
from grpocli.trainer.rollback import checkpoint_before, discard_after, rollbacks_taken


def _step(step: int, **figures: float) -> dict:
    return {"step": step, "loss": 0.1, "grad_norm": 1.0, **figures}


def test_non_finite_values_follow_the_action_unless_on_nonfinite_loss_says_otherwise():
    rollback = GuardSection(action="rollback")
    trip = Watchdog(rollback, "guard").check(_step(3, loss=math.nan, grad_norm=math.nan))
    assert (trip.step, trip.first, trip.metric, trip.action, trip.key) == (3, 3, "loss", "rollback", "train.guard.action")
    assert trip.render() == "step 3: the loss is nan (not finite)"
    assert Watchdog(rollback, "raise").check(_step(3, grad_norm=math.inf)).action == "stop"
    assert Watchdog(rollback, "skip").check(_step(3, grad_norm=math.inf)).action == "skip"
    # fp16: the loss scaler's own overflow (a finite loss) is skipped as it always was; a NaN loss is not
    scaled = Watchdog(rollback, "guard", loss_scaled=True)
    assert scaled.check(_step(3, grad_norm=math.inf)).action == "skip"
    assert scaled.check(_step(4, loss=math.nan, grad_norm=math.inf)).action == "rollback"
    assert Watchdog(rollback, "guard").check(_step(5)) is None  # a step that computed nothing has 0.0 for both


def test_kl_trips_at_once_and_entropy_after_patience_steps_in_a_row():
    guard = GuardSection(action="stop", max_kl=0.5, min_entropy=1.0, entropy_patience=3)
    dog = Watchdog(guard, "guard")
    assert dog.check(_step(1, kl=0.5, entropy=2.0)) is None  # at the bound is not above it
    trip = dog.check(_step(2, kl=0.7, entropy=0.5))
    assert (trip.metric, trip.value, trip.key, trip.bound) == ("kl", 0.7, "train.guard.max_kl", 0.5)
    assert "kl 0.7 is above train.guard.max_kl = 0.5" in trip.render()
    assert dog.check(_step(3, entropy=0.5)) is None  # the streak began at step 2, under the kl trip
    assert dog.check(_step(4)) is None  # no figure (no loss token): the streak neither grows nor ends
    trip = dog.check(_step(5, entropy=0.25))
    assert (trip.metric, trip.step, trip.first, trip.action) == ("entropy", 5, 2, "stop")
    assert "since step 2" in trip.what()
    assert dog.check(_step(6, entropy=0.25)) is None  # a new streak starts after a trip
    assert dog.check(_step(7, entropy=1.5)) is None and dog.low_since is None  # entropy back: the streak ends


@pytest.mark.parametrize(("override", "key", "valid"), [
    (["train.guard.max_kl=0"], "train.guard.max_kl", "greater than 0"),
    (["train.guard.min_entropy=-1"], "train.guard.min_entropy", "greater than 0"),
    (["train.guard.rollback_lr_scale=0"], "train.guard.rollback_lr_scale", "greater than 0"),
    (["train.guard.rollback_lr_scale=1.5"], "train.guard.rollback_lr_scale", "less than or equal to 1"),
    (["train.guard.entropy_patience=0"], "train.guard.entropy_patience", "greater than or equal to 1"),
    (["train.guard.action=rollback"], "train.save_steps = 0", "train.save_steps = N > 0"),
    (["train.guard.max_kl=1"], "algorithm.beta = 0", "algorithm.beta > 0"),
    (["train.guard.action=rollback", "train.save_steps=2", "generation.backend=vllm", "generation.async_steps=1"],
     "generation.async_steps > 0", "async_steps = 0"),
])
def test_guard_settings_that_cannot_work_are_refused_when_the_recipe_loads(override, key, valid):
    with pytest.raises(UserError) as caught:
        load_recipe("quickstart", override)
    assert key in str(caught.value) and valid in str(caught.value)


def test_a_refused_guard_setting_is_exit_2_before_any_model(grpo):
    out = grpo("train", "quickstart", "train.guard.action=rollback", "--dry-run")
    assert_user_error(out, "train.guard.action = 'rollback'", "train.save_steps = 0", "valid: train.save_steps = N > 0")


def test_discard_after_moves_the_later_steps_aside_and_the_summary_says_so(tmp_path):
    run = RunDir(tmp_path / "run")
    for step in (2, 4):
        (run.checkpoint(step) / "trainer").mkdir(parents=True)
    run.rollouts.mkdir()
    for step in range(1, 5):
        run.rollout_file(step).write_text(json.dumps({"step": step}) + "\n")
        (run.root / "eval" / f"step-{step}-test").mkdir(parents=True)
    rows = [{"step": s, "reward": -1.0 + s / 10} for s in range(1, 6)] + [{"step": 4, "eval/reward": 0.5}]
    run.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert rollbacks_taken(run) == 0 and checkpoint_before(run, 4) is None  # neither is intact (no weights)
    record = {"rollback": 1, "at_step": 5, "to_step": 2, "lr_scale": 0.5, "reason": "the loss is nan (not finite)"}
    folder = discard_after(run, 2, 1, record)
    assert folder == run.discarded / "rollback-1" and rollbacks_taken(run) == 1
    assert [r["step"] for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())] == [3, 4, 5, 4]
    assert sorted(p.name for p in (folder / "rollouts").iterdir()) == ["step-3.jsonl", "step-4.jsonl"]
    assert sorted(p.name for p in (folder / "eval").iterdir()) == ["step-3-test", "step-4-test"]
    assert [p.name for p in (folder / "checkpoints").iterdir()] == ["step-4"]
    assert [s for s, _ in run.list_checkpoints()] == [2]
    assert sorted(p.name for p in run.rollouts.iterdir()) == ["step-1.jsonl", "step-2.jsonl"]
    assert json.loads((folder / "rollback.json").read_text()) == record
    run.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))  # what MetricsLog keeps on reopening
    lines = summary_lines(run.root, 3.0)
    assert ("rolled back at step 5 to step 2, lr x0.5 (the loss is nan (not finite)); the undone steps are kept in "
            "discarded/rollback-1/") in lines
