"""Alerts about a training run, read from its metrics (one dict per step, as in metrics.jsonl):
pure functions, no torch, cheap per step. `grpo inspect` and the trainer show them as warnings.

Each rule is a named function in ``RULES`` that looks at a bounded window of the history
ending at ``end`` (the first and last few steps), so ``check`` costs O(window) whatever the
run's length and the trainer can call it every step. The failure modes are those GRPO users
report (TRL / open-instruct / verl issues; DAPO, Yu et al. 2025, on zero-spread groups and
overlong completions):

    no_signal          every completion of a group gets the same reward (frac_reward_zero_std
                       near 1) for many steps: advantages are 0, the model does not learn
    truncated          most completions hit max_completion_length
    format_only        the reward rises only in the format component (rewards named format.*)
    length_explosion   the mean completion length grows several-fold
    kl_explosion       the KL to the reference grows large
    entropy_collapse   the policy's entropy falls to a small part of its early value
    spread_loss        the share of groups without reward spread climbs high (before no_signal)
    skipped_updates    many optimizer steps are skipped (no group in the loss, or a non-finite
                       gradient)
    grad_spike         the gradient norm jumps far above its running median

``check(history)`` says what holds now; ``scan(history)`` says when each first and last held
(`grpo inspect`); ``Watch`` keeps the history during training and reports each alert as it starts.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

NO_SIGNAL_FRAC, NO_SIGNAL_STEPS = 0.9, 10
TRUNCATED_FRAC, TRUNCATED_STEPS = 0.5, 5
FORMAT_WINDOW, FORMAT_RISE, TASK_FLAT = 10, 0.2, 0.05
LENGTH_WINDOW, LENGTH_GROWTH, LENGTH_MIN_TOKENS = 5, 3.0, 32.0
KL_WINDOW, KL_LIMIT, KL_GROWTH, KL_FLOOR = 3, 1.0, 10.0, 0.1
ENTROPY_WINDOW, ENTROPY_FRACTION, ENTROPY_FLOOR = 5, 0.2, 0.1
SPREAD_WINDOW, SPREAD_LEVEL, SPREAD_RISE = 5, 0.6, 0.3
SKIP_WINDOW, SKIP_MIN_STEPS, SKIP_FRAC, SKIP_COUNT = 10, 5, 0.3, 3
GRAD_WINDOW, GRAD_MIN_STEPS, GRAD_SPIKE = 20, 5, 10.0
FORMAT_PREFIX = "format."

History = Sequence[dict[str, Any]]


@dataclass(frozen=True)
class Alert:
    """One condition a rule found: its code (a key of RULES), what it means and what to do."""

    code: str
    message: str
    step: int                      # the step the condition was seen at
    last_step: int | None = None   # scan(): the last step it held (None: still holds at the end)

    def render(self) -> str:
        return f"step {self.step}: {self.message} [{self.code}]"


def check(metrics_history: History) -> list[Alert]:
    """The alerts that hold at the end of ``metrics_history`` (one dict per step, oldest first)."""
    end = len(metrics_history)
    return [w for rule in RULES.values() if (w := rule(metrics_history, end)) is not None]


def scan(metrics_history: History) -> list[Alert]:
    """Each alert that held at some point, with the first step it held and the last one
    (``last_step`` None when it still holds at the end). O(steps x window)."""
    first: dict[str, Alert] = {}
    last: dict[str, int] = {}
    for end in range(1, len(metrics_history) + 1):
        for code, rule in RULES.items():
            w = rule(metrics_history, end)
            if w is not None:
                first.setdefault(code, w)
                last[code] = end
    out = []
    for code, w in first.items():
        still = last[code] == len(metrics_history)
        out.append(Alert(w.code, w.message, w.step, None if still else _step(metrics_history, last[code])))
    return sorted(out, key=lambda w: w.step)


class Watch:
    """Live alerts for the training loop: ``for w in watch.update(metrics): show(w)``.

    Keeps the history; ``update`` returns each alert once when it starts to hold (again after it
    stopped).
    """

    def __init__(self) -> None:
        self.history: list[dict[str, Any]] = []
        self.active: set[str] = set()

    def update(self, metrics: dict[str, Any]) -> list[Alert]:
        self.history.append(metrics)
        now = check(self.history)
        new = [w for w in now if w.code not in self.active]
        self.active = {w.code for w in now}
        return new


# -- rules: (history, end) -> Alert | None, reading history[:end] ---------------------------
def no_signal(h: History, end: int) -> Alert | None:
    values = _window(h, end, "frac_reward_zero_std", NO_SIGNAL_STEPS)
    if len(values) < NO_SIGNAL_STEPS or min(values) < NO_SIGNAL_FRAC:
        return None
    return Alert("no_signal", (
        f"no learning signal: for {NO_SIGNAL_STEPS} steps {_pct(_mean(values))} of groups gave every "
        "completion the same reward (frac_reward_zero_std), so their advantages are 0. Make the task "
        "fit the model (easier prompts or a partial-credit reward), raise generation.num_generations "
        "or generation.temperature, and look at the rewards in rollouts/"), _step(h, end))


def truncated(h: History, end: int) -> Alert | None:
    values = _window(h, end, "completions/clipped_ratio", TRUNCATED_STEPS)
    if len(values) < TRUNCATED_STEPS or _mean(values) < TRUNCATED_FRAC:
        return None
    return Alert("truncated", (
        f"most completions are truncated: {_pct(_mean(values))} hit generation.max_completion_length "
        f"over the last {TRUNCATED_STEPS} steps. Raise max_completion_length, or set "
        "algorithm.mask_truncated_completions / algorithm.overlong_penalty"), _step(h, end))


def format_only(h: History, end: int) -> Alert | None:
    if end < 2 * FORMAT_WINDOW:
        return None
    names = [k for k in h[end - 1] if k.startswith("rewards/") and k.endswith("/mean")
             and k.count("/") == 2]  # not a [[data.sources]] source's rewards/<source>/<reward>/mean
    formats = [k for k in names if k[len("rewards/"):].startswith(FORMAT_PREFIX)]
    tasks = [k for k in names if k not in formats]
    if not formats or not tasks:
        return None
    rise = {k: _rise(h, end, k, FORMAT_WINDOW) for k in names}
    risen = [k for k in formats if rise[k] is not None and rise[k] >= FORMAT_RISE]
    if not risen or any(rise[k] is None or rise[k] > TASK_FLAT for k in tasks):
        return None
    fmt = ", ".join(f"{_name(k)} {rise[k]:+.2f}" for k in risen)
    task = ", ".join(f"{_name(k)} {rise[k]:+.2f}" for k in tasks)
    return Alert("format_only", (
        f"the reward rises only in the format component ({fmt}; {task}): the model learns the format, "
        "not the task. Check the task reward on rollouts/, lower the format rewards' weight, or use "
        "algorithm.reward_combination = 'gated'"), _step(h, end))


def length_explosion(h: History, end: int) -> Alert | None:
    key = "completions/mean_length"
    early = _window(h, min(end, LENGTH_WINDOW), key, LENGTH_WINDOW)
    recent = _window(h, end, key, LENGTH_WINDOW)
    if end < 2 * LENGTH_WINDOW or not early or not recent:
        return None
    before, now = _mean(early), _mean(recent)
    if now < LENGTH_GROWTH * max(before, 1.0) or now - before < LENGTH_MIN_TOKENS:
        return None
    return Alert("length_explosion", (
        f"completion length is exploding: {before:.0f} -> {now:.0f} tokens ({now / max(before, 1.0):.1f}x) "
        "since the start. Look for repetition in rollouts/; consider algorithm.overlong_penalty, a length "
        "reward, or a lower train.learning_rate"), _step(h, end))


def kl_explosion(h: History, end: int) -> Alert | None:
    recent = _window(h, end, "kl", KL_WINDOW)
    if len(recent) < KL_WINDOW:
        return None
    now = _mean(recent)
    early = [v for v in _window(h, min(end, 2 * KL_WINDOW), "kl", 2 * KL_WINDOW) if v > 0]
    baseline = _mean(early) if early and end > 3 * KL_WINDOW else None
    grown = baseline is not None and now >= KL_FLOOR and now >= KL_GROWTH * baseline
    if now < KL_LIMIT and not grown:
        return None
    since = f" (from {baseline:.3g} at the start)" if baseline is not None else ""
    return Alert("kl_explosion", (
        f"KL to the reference is exploding: {now:.3g} over the last {KL_WINDOW} steps{since}. Lower "
        "train.learning_rate, raise algorithm.beta, or check for a reward that can be gamed"), _step(h, end))


def entropy_collapse(h: History, end: int) -> Alert | None:
    early = _window(h, min(end, ENTROPY_WINDOW), "entropy", ENTROPY_WINDOW, updated=True)
    recent = _window(h, end, "entropy", ENTROPY_WINDOW, updated=True)
    if end < 2 * ENTROPY_WINDOW or not early or not recent:
        return None
    before, now = _mean(early), _mean(recent)
    if before <= 0 or now >= ENTROPY_FRACTION * before or now >= ENTROPY_FLOOR:
        return None
    return Alert("entropy_collapse", (
        f"entropy collapsed: {before:.3g} -> {now:.3g} nats/token ({_pct(now / before)} of its start): the "
        "policy samples nearly the same completion every time, so groups lose their spread and exploration "
        "stops. Raise generation.temperature, lower train.learning_rate, widen the clip upward "
        "(algorithm.epsilon_high, DAPO's clip-higher) or add algorithm.entropy_coef > 0"), _step(h, end))


def spread_loss(h: History, end: int) -> Alert | None:
    early = _window(h, min(end, SPREAD_WINDOW), "frac_reward_zero_std", SPREAD_WINDOW)
    recent = _window(h, end, "frac_reward_zero_std", SPREAD_WINDOW)
    if end < 2 * SPREAD_WINDOW or not early or not recent or no_signal(h, end) is not None:
        return None
    before, now = _mean(early), _mean(recent)
    if now < SPREAD_LEVEL or now - before < SPREAD_RISE:
        return None
    return Alert("spread_loss", (
        f"more and more groups have no reward spread: frac_reward_zero_std {_pct(before)} -> {_pct(now)} "
        "(every completion of a group got the same reward, so it teaches nothing). The prompts became too "
        "easy (all solved: look at the reward) or too hard. Use harder prompts or a curriculum "
        "(train.curriculum), raise generation.num_generations, or set algorithm.fill_batch = true "
        "(DAPO's dynamic sampling)"), _step(h, end))


def skipped_updates(h: History, end: int) -> Alert | None:
    values = _window(h, end, "skipped_update", SKIP_WINDOW)
    skipped = sum(v > 0 for v in values)
    if len(values) < SKIP_MIN_STEPS or skipped < SKIP_COUNT or skipped < SKIP_FRAC * len(values):
        return None
    return Alert("skipped_updates", (
        f"{skipped} of the last {len(values)} optimizer steps were skipped (skipped_update): no group had "
        "reward spread, or the gradient was not finite. With frac_reward_zero_std near 1 make the task fit "
        "the model (see no_signal); otherwise lower train.learning_rate, keep train.max_grad_norm > 0 and "
        "prefer bf16 to fp16 (train.mixed_precision)"), _step(h, end))


def grad_spike(h: History, end: int) -> Alert | None:
    now = _window(h, end, "grad_norm", 1)
    before = [v for v in _window(h, end - 1, "grad_norm", GRAD_WINDOW) if v > 0]
    if not now or len(before) < GRAD_MIN_STEPS:
        return None
    median = statistics.median(before)
    if now[0] <= GRAD_SPIKE * median:
        return None
    return Alert("grad_spike", (
        f"gradient-norm spike: grad_norm {now[0]:.3g} is {now[0] / median:.0f}x its running median {median:.3g} "
        f"(last {len(before)} steps). Look at this step's rollouts (grpo inspect RUN --rollouts STEP) for "
        "degenerate or very long completions; lower train.learning_rate, or clip harder "
        "(train.max_grad_norm)"), _step(h, end))


RULES: dict[str, Callable[[History, int], Alert | None]] = {
    "no_signal": no_signal,
    "truncated": truncated,
    "format_only": format_only,
    "length_explosion": length_explosion,
    "kl_explosion": kl_explosion,
    "entropy_collapse": entropy_collapse,
    "spread_loss": spread_loss,
    "skipped_updates": skipped_updates,
    "grad_spike": grad_spike,
}


# -- helpers ---------------------------------------------------------------------------------
def _window(h: History, end: int, key: str, size: int, *, updated: bool = False) -> list[float]:
    """The finite numbers under ``key`` in h[end-size:end] (``updated``: of steps not skipped,
    whose figures describe a real update: a skipped one logs entropy 0)."""
    out = []
    for m in h[max(0, end - size):end]:
        if updated and m.get("skipped_update"):
            continue
        v = m.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append(float(v))
    return out


def _rise(h: History, end: int, key: str, size: int) -> float | None:
    early, recent = _window(h, size, key, size), _window(h, end, key, size)
    return _mean(recent) - _mean(early) if early and recent else None


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _step(h: History, end: int) -> int:
    return int(h[end - 1].get("step", end))


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _name(key: str) -> str:
    return key[len("rewards/"):-len("/mean")]
