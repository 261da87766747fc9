"""train.guard: after each optimizer step, whether it went wrong, and what the run does then.

    Watchdog   pure: a step's metrics in, a Trip out (or None): a non-finite loss or gradient norm
               (train.on_nonfinite_loss), kl above train.guard.max_kl, entropy below
               train.guard.min_entropy for entropy_patience steps in a row
    Guard      the loop's side: `check` marks the step's metrics line (guard/tripped = 1) before it is
               written; `act`, once the step is recorded, does what train.guard.action says: 'skip' says
               so and goes on, 'stop' raises TrainingStopped (exit 2), 'rollback' restores the newest
               checkpoint before the bad steps (grpocli.trainer.rollback) and the loop generates again

A step's figures are summed over the processes, so every process trips alike and acts alike.
docs/faults.md ("A step goes wrong") says it for users.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grpocli.trainer.metrics import MetricsLog
from grpocli.trainer.rollback import checkpoint_before, discard_after, restore, rollbacks_taken
from grpocli.trainer.session import TrainingStopped

if TYPE_CHECKING:
    from grpocli.recipe.guard_section import GuardSection
    from grpocli.trainer.session import Session


@dataclass(frozen=True)
class Trip:
    step: int             # the step whose figures tripped the guard
    first: int            # the first bad step (entropy: where the low streak began); a rollback goes before it
    metric: str           # its metrics.jsonl key: loss, grad_norm, kl, entropy
    value: float
    key: str              # the recipe key that decides (the bound's, or the action's for a non-finite value)
    bound: float | None   # max_kl or min_entropy; None for a non-finite value
    action: str           # "skip", "rollback" or "stop"

    def what(self) -> str:
        """What went wrong, without the step: "the loss is nan (not finite)"."""
        if self.bound is None:
            return f"the {self.metric} is {self.value} (not finite)"
        if self.metric == "kl":
            return f"kl {self.value:.4g} is above {self.key} = {self.bound:g}"
        return (f"entropy {self.value:.4g} has been below {self.key} = {self.bound:g} for {self.step - self.first + 1} "
                f"steps since step {self.first} (train.guard.entropy_patience)")

    def render(self) -> str:
        return f"step {self.step}: {self.what()}"


class Watchdog:
    """The checks of train.guard over a run's steps (it remembers the current low-entropy streak)."""

    def __init__(self, guard: GuardSection, on_nonfinite: str, *, loss_scaled: bool = False) -> None:
        """`loss_scaled`: fp16's loss scaler is on, whose own overflows (a finite loss, a non-finite
        gradient norm) are skipped as they always were: the scaler lowers its scale and goes on."""
        self.guard, self.on_nonfinite, self.loss_scaled = guard, on_nonfinite, loss_scaled
        self.low_since: int | None = None  # the first step of the current run of low entropy

    def check(self, metrics: dict[str, Any]) -> Trip | None:
        """The step's trip, if any: a non-finite value first, then kl, then a long enough low-entropy streak."""
        step, g = int(metrics["step"]), self.guard
        collapsed = self._low_entropy(step, metrics.get("entropy"))  # the streak counts every step
        for name in ("loss", "grad_norm"):
            value = metrics.get(name)
            if isinstance(value, float) and not math.isfinite(value):
                action, key = self._nonfinite_action(name)
                return Trip(step, step, name, value, key, None, action)
        kl = metrics.get("kl")
        if g.max_kl is not None and _number(kl) and kl > g.max_kl:
            return Trip(step, step, "kl", kl, "train.guard.max_kl", g.max_kl, g.action)
        if not collapsed:
            return None
        trip = Trip(step, self.low_since, "entropy", metrics["entropy"], "train.guard.min_entropy", g.min_entropy,
                    g.action)
        self.low_since = None  # skip: the next trip needs a whole new streak
        return trip

    def _nonfinite_action(self, metric: str) -> tuple[str, str]:
        if self.loss_scaled and metric == "grad_norm":
            return "skip", "train.mixed_precision"
        if self.on_nonfinite == "guard":
            return self.guard.action, "train.guard.action"
        return ("stop" if self.on_nonfinite == "raise" else "skip"), "train.on_nonfinite_loss"

    def _low_entropy(self, step: int, entropy: Any) -> bool:
        """Whether entropy has now been below min_entropy for entropy_patience steps in a row; a step
        without the figure (it computed no loss token) neither lengthens nor ends the streak."""
        g = self.guard
        if g.min_entropy is None or not _number(entropy):
            return False
        if entropy >= g.min_entropy:
            self.low_since = None
            return False
        self.low_since = step if self.low_since is None else self.low_since
        return step - self.low_since + 1 >= g.entropy_patience

    def reset(self) -> None:
        self.low_since = None


class Guard:
    def __init__(self, s: Session) -> None:
        t = s.recipe.train
        self.s = s
        accelerator = s.parallel.accelerator  # fp16 natively or under DeepSpeed: a loss scaler whose overflows are routine
        scaled = getattr(accelerator, "mixed_precision", "no") == "fp16" if accelerator is not None else False
        self.watchdog = Watchdog(t.guard, t.on_nonfinite_loss, loss_scaled=scaled)
        self.rollbacks = rollbacks_taken(s.run)  # read once, before any step: every process counts alike
        self.trip: Trip | None = None

    def check(self, metrics: dict[str, Any]) -> None:
        """Before the step's metrics line is written: a trip marks it (guard/tripped = 1)."""
        self.trip = self.watchdog.check(metrics)
        if self.trip is not None:
            metrics["guard/tripped"] = 1.0

    def act(self) -> bool:
        """After the step is recorded: what its trip asks. True when the run rolled back (the rest of the
        generation cycle is not trained; the loop generates again from the checkpoint's step)."""
        trip, self.trip = self.trip, None
        if trip is None:
            return False
        if trip.action == "stop":
            said = "train.on_nonfinite_loss = 'raise'" if trip.key == "train.on_nonfinite_loss" else \
                "train.guard.action = 'stop'"
            raise self.stopped(trip, f"the run stops ({said})")
        if trip.action == "skip":
            applied = "the update was not applied" if trip.bound is None else "the update stays"
            self.note(f"{trip.render()}; {applied} and training goes on ({_skip_key(trip)})")
            return False
        self.roll_back(trip)
        return True

    def roll_back(self, trip: Trip) -> None:
        s, g = self.s, self.s.recipe.train.guard
        if self.rollbacks >= g.max_rollbacks:
            raise self.stopped(trip, f"no rollback is left: this run directory has taken {self.rollbacks} "
                               f"(train.guard.max_rollbacks = {g.max_rollbacks})")
        target = checkpoint_before(s.run, trip.first)
        if target is None:
            raise self.stopped(trip, f"there is no checkpoint before step {trip.first} to roll back to "
                               f"(train.save_steps = {s.recipe.train.save_steps})")
        self.rollbacks += 1
        scale = s.state.lr_scale * g.rollback_lr_scale
        record = {"rollback": self.rollbacks, "at_step": trip.step, "to_step": target[0],
                  "checkpoint": str(target[1]), "lr_scale": scale, "metric": trip.metric,
                  "value": trip.value if math.isfinite(trip.value) else str(trip.value), "key": trip.key,
                  "reason": trip.what()}
        s.parallel.wait()  # every process chose the checkpoint before the main one moves files
        folder = None
        if s.parallel.main:
            if s.metrics is not None:
                s.metrics.close()  # its later lines move away, then it goes on from the checkpoint's step
            folder = discard_after(s.run, target[0], self.rollbacks, record)
        s.parallel.wait()
        restore(s, target[1], scale)
        self.watchdog.reset()
        if s.parallel.main:
            s.metrics = MetricsLog(s.run, resume_step=target[0])
            s.metrics.write({"step": target[0], "guard/rollback": self.rollbacks, "guard/rolled_back_from": trip.step,
                             "guard/lr_scale": scale})
        self.note(f"{trip.render()}; rolled back to {target[1]} (step {target[0]}), learning rate "
                  f"x{scale:g} (rollback {self.rollbacks} of at most {g.max_rollbacks}, train.guard.max_rollbacks); "
                  f"the undone steps' metrics and rollouts are kept in {folder or s.run.discarded}")

    def stopped(self, trip: Trip, why: str) -> TrainingStopped:
        s = self.s
        saved = checkpoint_before(s.run, trip.step + 1)
        kept = (f"{saved[1]} is the newest checkpoint; the same command resumes from step {saved[0]}" if saved
                else "no checkpoint was written yet")
        guard = " train.on_nonfinite_loss=guard and" if trip.key == "train.on_nonfinite_loss" else ""
        return TrainingStopped(
            f"{trip.what()}, at step {trip.step}: {why}; metrics.jsonl holds the steps up to {trip.step}, {kept}",
            where=trip.key, valid=_valid(trip),
            hint=f"lower train.learning_rate or set train.max_grad_norm; to go on past such a step:{guard} "
            "train.guard.action=rollback with train.save_steps=N (back to the newest checkpoint before it, the "
            "learning rate scaled by train.guard.rollback_lr_scale), or train.guard.action=skip",
        )

    def note(self, text: str) -> None:
        if self.s.parallel.main:
            self.s.progress.note(text, always=True)


def _valid(trip: Trip) -> str:
    if trip.bound is None:
        return f"a finite {trip.metric}"
    if trip.metric == "kl":
        return f"kl at most {trip.bound:g}"
    return f"entropy of at least {trip.bound:g} on one step or more of any {trip.step - trip.first + 1} in a row"


def _skip_key(trip: Trip) -> str:
    if trip.key == "train.mixed_precision":
        return "fp16's loss scaler lowers its scale"
    if trip.key == "train.on_nonfinite_loss":
        return "train.on_nonfinite_loss = 'skip'"
    return "train.guard.action = 'skip'"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


__all__ = ["Guard", "Trip", "Watchdog"]
