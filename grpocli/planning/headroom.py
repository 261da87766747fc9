"""What the plan says of a bottleneck's remedies (grpocli.inspection.remedies): each change that needs
device memory asked of `grpo plan`'s model with the changed recipe (fits or not, the peak, micro-batches
a step), a larger vLLM share as the extra KV tokens per sequence it buys (grpocli.planning.engine_cache)
and a sync change as the bytes a sync sends. Without a device size (a CPU run; no --gpu-memory, no
train.memory_limit) nothing is asked and a note says what would ask it. `grpo inspect RUN` and
`grpo bench` print the result.

    generation 71% of the step: vllm.gpu_memory_utilization 0.5 -> 0.7: ...; plan: +2.1k tokens of KV
    per sequence (512 sequences), the trainer's phases fit (31.2 GiB of 80.0 GiB)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError
from grpocli.inspection.bottleneck import Bottleneck, find_bottleneck
from grpocli.inspection.remedies import Remedy, remedies, report
from grpocli.planning.engine_cache import EngineCache, engine_cache
from grpocli.planning.plan import Plan, gib, make_plan
from grpocli.planning.recipe_settings import with_changes as _with

if TYPE_CHECKING:
    from grpocli.planning.shapes import ModelShape
    from grpocli.recipe.schema import Recipe

#: The least vLLM share step tried when the full one (inspection.remedies.SHARE_STEP) does not fit.
SHARE_HALF_STEP = 0.1


@dataclass(frozen=True)
class Diagnosis:
    """A run's bottleneck, what to turn (the plan's answers filled in where it was asked), and notes."""

    bottleneck: Bottleneck
    remedies: tuple[Remedy, ...] = ()
    notes: tuple[str, ...] = ()
    checked_on: str = ""                     # "1 x 80.00 GiB": the devices the plan was asked about

    def lines(self, command: str | None = None, given: Sequence[str] = ()) -> list[str]:
        return report(self.bottleneck, self.remedies, notes=self.notes, command=command, given=tuple(given))

    def as_dict(self) -> dict[str, Any]:
        return {**self.bottleneck.as_dict(), "advice": [x.as_dict() for x in self.remedies],
                "notes": list(self.notes), "checked_on": self.checked_on}


def diagnose(history: Sequence[dict[str, Any]], r: Recipe | None, *, gpu_memory: int | None = None,
             gpus: int | None = None, gpu: bool | None = None, config: str | None = None,
             memory_hint: str = "") -> Diagnosis | None:
    """The bottleneck of `history` (metrics.jsonl's rows) and its remedies for recipe `r`, checked by the plan
    on `gpus` devices of `gpu_memory` bytes (else train.memory_limit, where the recipe sets it); None where no
    step records its phases. `gpu`: whether the run is on a GPU (None: not known; a device size says yes);
    `memory_hint`: how to give a device size, for the note when none is known."""
    b = find_bottleneck(history)
    if b is None:
        return None
    if r is None:
        return Diagnosis(b, notes=("the run's recipe (config.resolved.toml) could not be read: no advice",))
    found = remedies(b, r, gpu=True if gpu_memory else gpu)
    if not any(x.check for x in found):
        return Diagnosis(b, found)
    memory = gpu_memory or _memory_limit(r)
    if not memory:
        return Diagnosis(b, found, notes=(f"memory not checked: the plan needs a device size ({memory_hint})",))
    from grpocli.planning.shapes import shape_of
    from grpocli.planning.teacher import teacher_shape

    try:
        shape = shape_of(r.model, config)
        teacher_shape(r)  # a [distill] teacher that cannot be read is said here, as the model is
    except UserError as err:
        hint = "grpo plan RECIPE --config PATH/config.json --gpu-memory SIZE checks each change"
        return Diagnosis(b, found, notes=(f"memory not checked: {err.what} ({hint})",))
    n = gpus or r.train.num_processes
    return Diagnosis(b, tuple(checked(x, r, shape, gpus=n, memory=memory) for x in found),
                     checked_on=f"{n} x {gib(memory)}",
                     notes=(f"plan: grpo plan's model of each changed recipe on {n} x {gib(memory)}",))


def _memory_limit(r: Recipe) -> int | None:
    limit = getattr(r.train, "memory_limit", None)  # a key newer recipes have
    return int(limit) if limit else None


def checked(x: Remedy, r: Recipe, shape: ModelShape, *, gpus: int, memory: int) -> Remedy:
    """`x` with what the plan says of it (unchanged where it has nothing to say)."""
    if not x.check or not x.paste:
        return x
    changes = {key: to for key, _, to in x.changes}
    if x.check == "memory":
        return replace(x, plan=_fits(r, changes, shape, gpus, memory, passes=not x.gain))
    base = engine_cache(r, shape, gpus=gpus, gpu_memory=memory)
    if base is None:
        return x
    if x.check == "sync":
        after = engine_cache(_with(r, changes), shape, gpus=gpus, gpu_memory=memory)
        if after is None:
            return x
        said = (f"a sync sends {gib(after.sync)} instead of {gib(base.sync)}" if after.sync != base.sync else
                f"a sync sends {gib(base.sync)} either way (on a GPU 'auto' already sends the adapters alone)")
        return replace(x, plan=f"plan: {said}")
    if "vllm.gpu_memory_utilization" in changes:
        return _larger_share(x, r, shape, gpus, memory, base)
    plan = make_plan(_with(r, changes), shape, gpus=gpus, gpu_memory=memory, knobs=False)
    return replace(x, plan=f"plan: {_held(plan.engine_cache)}; {_fit_text(plan, memory)}")


def _fit_text(plan: Plan, memory: int) -> str:
    return (f"{'fits' if plan.fits else 'does not fit'} (its {plan.peak.name} phase {gib(plan.peak.total)} "
            f"per process of {gib(memory)})")


def _fits(r: Recipe, changes: dict[str, Any], shape: ModelShape, gpus: int, memory: int, *, passes: bool) -> str:
    """Whether the changed recipe fits (`passes`: with its micro-batches a step, where they change)."""
    before = make_plan(r, shape, gpus=gpus, gpu_memory=memory, knobs=False)
    n = int(changes.get("train.num_processes", gpus))
    after = make_plan(_with(r, changes), shape, gpus=n, gpu_memory=memory, knobs=False)
    text = f"plan: {_fit_text(after, memory)}"
    if passes and before.settings.micro_batches != after.settings.micro_batches:
        text += f", {before.settings.micro_batches} -> {after.settings.micro_batches} micro-batches a step"
    if not after.fits and before.largest_micro_batch:
        text += f"; the largest that fits: train.micro_batch_size={before.largest_micro_batch}"
    return text


def _held(cache: EngineCache | None) -> str:
    if cache is None:
        return "no colocated engine"
    text = (f"the engine holds {cache.sequences} sequences ({cache.batches} batch(es)), their KV at full length "
            f"{gib(cache.needed)} of the {gib(cache.available)} its share leaves")
    return text + ("" if cache.fits else ": vLLM preempts the rest (slower, not out of memory)")


def _larger_share(x: Remedy, r: Recipe, shape: ModelShape, gpus: int, memory: int, base: EngineCache) -> Remedy:
    """The largest step up of vllm.gpu_memory_utilization whose plan fits (x's, else half of it), with
    the KV tokens per sequence it adds."""
    (key, now, to), = x.changes
    for share in dict.fromkeys((to, round(now + SHARE_HALF_STEP, 2))):
        plan = make_plan(_with(r, {key: share}), shape, gpus=gpus, gpu_memory=memory, knobs=False)
        if plan.fits:
            break
    x = replace(x, changes=((key, now, share),))
    if not plan.fits or plan.engine_cache is None:
        return replace(x, plan=f"plan: {_fit_text(plan, memory)}: the trainer leaves no room for a larger share")
    length = r.data.max_prompt_length + r.generation.max_completion_length
    per_token = base.needed / max(base.sequences * length, 1)  # bytes of one token's keys and values
    extra = (plan.engine_cache.available - base.available) / per_token / max(base.sequences, 1)
    text = f"plan: +{_count(extra)} tokens of KV per sequence ({base.sequences} sequences at once)"
    if share != to:
        text += f"; {to} would not fit"
    if base.fits:
        text += (f", but the cache already holds them all at full length ({gib(base.needed)} of "
                 f"{gib(base.available)}): vLLM preempts none now, the extra would lie unused")
    return replace(x, plan=f"{text}; {_fit_text(plan, memory)}")


def _count(n: float) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else f"{n:.0f}"


__all__ = ["Diagnosis", "checked", "diagnose"]
