"""The whole recipe's wall time, forecast from a few measured steps.

Step 1 is warm-up (kernels, caches, the engine's first batch) and is left out when later steps
exist. Over the measured steps each phase gets a rate against what drives it:

    generation               seconds per token of the batch's longest completion (a batch decodes
                             until its longest sequence ends, on transformers and vLLM alike)
    log-prob passes, training  seconds per trained token (the kept groups' prompt + completions)
    rewards, weight sync, other  seconds per step, as measured

Where generation ran beside training (generation.async_steps, pipeline "inflight") the step is the
longer of the two sides, from the measured overlap: the trainer's (log-prob passes, training and
the per-step phases) and the engine's busy seconds (the step's wall time less the engine's idle
time), per token of the batch's longest completion.

A step of the run then costs those rates at the lengths the model produces now (the last measured
step's longest completion and trained tokens); `at_max_length` is the same at
generation.max_completion_length for every completion (the bound if answers grow). The run's
total adds the start-up as measured, and each evaluation and checkpoint the recipe makes at the
time one of them took here.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpocli.benchmark.measurement import MeasuredStep, Measurement


@dataclass(frozen=True)
class Forecast:
    steps: int                     # the recipe's train.steps
    measured_s_per_step: float     # mean over the measured steps (after warm-up)
    s_per_step: float              # at the lengths the model produces now
    s_per_step_at_max: float       # every completion at max_completion_length
    evaluations: int
    checkpoints: int
    total_s: float                 # start-up + steps x s_per_step + evaluations + checkpoints
    total_at_max_s: float
    lengths: str                   # the correction, in words


def measured(records: list[MeasuredStep]) -> list[MeasuredStep]:
    """The steps that count: all but the warm-up step 1 (when there are others)."""
    return records[1:] if len(records) > 1 else records


def step_seconds(records: list[MeasuredStep], longest: float, trained: float) -> float:
    """A step's seconds at `longest` completion tokens (the batch's longest) and `trained` trained tokens."""
    rows = measured(records)
    gen = sum(r.phases["generation"] for r in rows) / max(sum(r.longest_completion for r in rows), 1)
    per_token = sum(r.phases["training"] + r.phases["logprobs"] for r in rows) / max(sum(r.trained_tokens for r in rows), 1)
    fixed = sum(r.phases["rewards"] + r.phases["weight_sync"] + r.phases["other"] for r in rows) / len(rows)
    if all(r.overlapped for r in rows):  # the longer of the trainer's side and the engine's busy time
        busy = sum(r.seconds - r.engine_idle for r in rows) / max(sum(r.longest_completion for r in rows), 1)
        return max(per_token * trained + fixed, busy * longest)
    return gen * longest + per_token * trained + fixed


def counts(steps: int, eval_every: int, save_steps: int) -> tuple[int, int]:
    """(evaluations, checkpoints) a run of `steps` makes: every eval_every steps; every save_steps
    and at the end."""
    evaluations = steps // eval_every if eval_every else 0
    saves = set(range(save_steps, steps + 1, save_steps)) if save_steps else set()
    return evaluations, len(saves | {steps})


def forecast(m: Measurement, *, steps: int, max_completion_length: int, eval_every: int, save_steps: int) -> Forecast:
    rows = measured(m.steps)
    last = m.steps[-1]
    now = step_seconds(m.steps, last.longest_completion, last.trained_tokens)
    prompt_part = last.trained_tokens - last.trained_completion_tokens
    scale = max_completion_length / max(last.mean_completion, 1e-9)
    at_max = step_seconds(m.steps, max_completion_length, prompt_part + last.trained_completion_tokens * scale)
    evaluations, checkpoints = counts(steps, eval_every, save_steps)
    extra = evaluations * (m.evaluation_s or 0.0) + checkpoints * (m.checkpoint_s or 0.0)
    lengths = (f"longest completion {last.longest_completion} (mean {last.mean_completion:.1f}) at step {last.step} "
               f"of max_completion_length {max_completion_length}")
    return Forecast(
        steps=steps, measured_s_per_step=sum(r.seconds for r in rows) / len(rows), s_per_step=now,
        s_per_step_at_max=at_max, evaluations=evaluations, checkpoints=checkpoints,
        total_s=m.startup_s + steps * now + extra, total_at_max_s=m.startup_s + steps * at_max + extra,
        lengths=lengths,
    )
