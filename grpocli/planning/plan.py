"""The plan of a recipe: per-phase memory, the peak, whether it fits, the largest micro-batch that
does, and the knobs that would make it fit (each a `key=value` to paste, with what it saves).

Settings are read from the recipe as the trainer uses them: the micro-batch of the worst case
(every prompt data.max_prompt_length tokens long, every completion generation.max_completion_length),
laid out as grpocli.algorithms.packing lays it out (shared prompts under sdpa up to 4 x hidden
tokens a row, padded rows beyond, packed rows with flash-attention), split over train.sequence_parallel
processes (refused, as the trainer refuses it, where that does not divide the model's attention and
key-value heads or the processes); keys added by later versions (train.activation_offloading,
vllm.sleep_mode, train.logprob_micro_batch_size, train.logits_chunk_tokens, train.sequence_parallel)
are read where present.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError
from grpocli.planning.autosize import auto_sizes
from grpocli.planning.engine_cache import EngineCache, engine_cache
from grpocli.planning.memory import Phase, Settings, phases
from grpocli.planning.recipe_settings import largest_micro_batch, peak_of, sequence_parallel, settings_of
from grpocli.planning.recipe_settings import with_changes as _with
from grpocli.planning.shapes import ModelShape

if TYPE_CHECKING:
    from grpocli.recipe.schema import Recipe

GIB = 2**30


@dataclass(frozen=True)
class Knob:
    """A change that lowers the peak: the overrides to paste and the bytes it saves."""

    overrides: tuple[str, ...]
    saves: int
    fits: bool

    @property
    def text(self) -> str:
        return " ".join(self.overrides)


@dataclass(frozen=True)
class Plan:
    shape: ModelShape
    settings: Settings
    phases: tuple[Phase, ...]
    gpus: int
    gpu_memory: int                     # bytes per device
    memory_assumed: bool                # no CUDA device: an assumed size
    largest_micro_batch: int            # 0: not even 1 fits
    largest_tokens: int                 # a token budget of the same size
    knobs: tuple[Knob, ...] = ()
    together: tuple[str, ...] = ()      # knobs that fit together, greedily chosen
    sharding: str | None = None         # what accelerate's config decided (None: train.sharding)
    prompt_tokens: int = 0              # the worst case planned for: data.max_prompt_length
    completion_tokens: int = 0          # generation.max_completion_length
    engine_cache: EngineCache | None = None  # the colocated vLLM engine's KV cache (backend "vllm")
    auto: tuple[tuple[str, Any], ...] = ()   # what the recipe's "auto" keys became (grpocli.planning.autosize)
    teacher: str | None = None          # distill.teacher (settings.teacher: its shape, None where it is served)

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)

    @property
    def fits(self) -> bool:
        return self.peak.total <= self.gpu_memory

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.shape.as_dict(), "gpus": self.gpus, "gpu_memory_bytes": self.gpu_memory,
            "gpu_memory_assumed": self.memory_assumed, "fits": self.fits, "peak_phase": self.peak.name,
            "peak_bytes": self.peak.total,
            "phases": {p.name: {"total_bytes": p.total, "parts": dict(p.parts)} for p in self.phases},
            "sequence_parallel": self.settings.train.split,
            "largest_micro_batch_size": self.largest_micro_batch,
            "largest_max_tokens_per_micro_batch": self.largest_tokens,
            "knobs": [{"set": list(k.overrides), "saves_bytes": k.saves, "fits": k.fits} for k in self.knobs],
            "fits_with": list(self.together), "auto": dict(self.auto),
            "teacher": None if self.teacher is None else {
                "teacher": self.teacher, "served": self.settings.teacher is None,
                "model": None if self.settings.teacher is None else self.settings.teacher.as_dict()},
            "engine_kv_cache": None if self.engine_cache is None else {
                "sequences": self.engine_cache.sequences, "generation_batches": self.engine_cache.batches,
                "needed_bytes": self.engine_cache.needed, "available_bytes": self.engine_cache.available,
                "lora_bytes": self.engine_cache.lora, "sync_bytes": self.engine_cache.sync,
                "merged_sync_bytes": self.engine_cache.merged},
        }


# -- the plan ----------------------------------------------------------------------------------
def make_plan(r: Recipe, shape: ModelShape, *, gpus: int, gpu_memory: int, memory_assumed: bool = False,
              knobs: bool = True, sharding: str | None = None) -> Plan:
    """The plan of `r` on `gpus` devices of `gpu_memory` bytes (`knobs`: look for what would make it fit);
    "auto" sizes planned as `grpo train` would choose them (grpocli.planning.autosize)."""
    check_split(r, shape, gpus)
    chosen = auto_sizes(r, shape, gpus, gpu_memory, sharding)
    r = _with(r, {k: max(v, 16 if "tokens" in k else 1) if type(v) is int else v for k, v in chosen.items()})
    s = settings_of(r, shape, gpus=gpus, gpu_memory=gpu_memory, sharding=sharding)
    plan = Plan(shape=shape, settings=s, phases=phases(shape, s), gpus=gpus, gpu_memory=gpu_memory,
                memory_assumed=memory_assumed, largest_micro_batch=0, largest_tokens=0, sharding=sharding,
                prompt_tokens=r.data.max_prompt_length, completion_tokens=r.generation.max_completion_length,
                engine_cache=engine_cache(r, shape, gpus=gpus, gpu_memory=gpu_memory),
                auto=tuple((k, getattr(getattr(r, k.split(".")[0]), k.split(".")[1])) for k in chosen),
                teacher=r.distill.teacher if r.distill.on else None)
    largest = largest_micro_batch(r, shape, gpus, gpu_memory, sharding)
    length = r.data.max_prompt_length + r.generation.max_completion_length
    plan = replace(plan, largest_micro_batch=largest, largest_tokens=largest * length)
    if knobs and not plan.fits:
        found = _knobs(r, shape, plan)
        plan = replace(plan, knobs=found, together=_together(r, shape, plan, found))
    return plan


def check_split(r: Recipe, shape: ModelShape, gpus: int) -> None:
    """UserError unless train.sequence_parallel = N can split this model over these processes, as the trainer
    refuses it (grpocli.parallel.ulysses.check_model, grpocli.parallel.open_split): N divides the attention
    and key-value heads (each process takes 1/N of each) and the processes."""
    n = sequence_parallel(r)
    if n <= 1:
        return
    heads, kv = shape.num_heads, shape.num_kv_heads
    if heads % n or kv % n:
        valid = [k for k in range(1, kv + 1) if heads % k == 0 and kv % k == 0]
        raise UserError(f"train.sequence_parallel = {n} does not divide the model's heads ({heads} attention heads, "
                        f"{kv} key-value heads): each process of a split takes 1/{n} of each",
                        where="train.sequence_parallel", valid=", ".join(map(str, valid)),
                        hint=f"set train.sequence_parallel to one of {', '.join(map(str, valid))}")
    if gpus % n:
        valid = [k for k in range(1, gpus + 1) if gpus % k == 0 and heads % k == 0 and kv % k == 0]
        raise UserError(f"train.sequence_parallel = {n} does not divide the {gpus} process(es) planned for: each "
                        f"split is {n} processes", where="train.sequence_parallel",
                        valid=f"with {gpus} process(es) and this model's heads: {', '.join(map(str, valid))}",
                        hint=f"grpo plan --gpus with a multiple of {n}, or another train.sequence_parallel")


def _split_sizes(r: Recipe, shape: ModelShape, gpus: int) -> list[int]:
    """train.sequence_parallel values above the recipe's that this model and these processes allow."""
    return [n for n in range(sequence_parallel(r) + 1, gpus + 1)
            if gpus % n == 0 and shape.num_heads % n == 0 and shape.num_kv_heads % n == 0]


def _candidates(r: Recipe, shape: ModelShape, plan: Plan) -> list[dict[str, Any]]:
    """Changes that can lower the peak, each as dotted keys to values."""
    t, m, s = r.train, r.model, plan.settings
    out: list[dict[str, Any]] = []
    if not m.gradient_checkpointing:
        out.append({"model.gradient_checkpointing": True})
    if plan.largest_micro_batch and plan.largest_micro_batch < s.train.rows:
        out.append({"train.micro_batch_size": plan.largest_micro_batch} if t.max_tokens_per_micro_batch is None
                   else {"train.max_tokens_per_micro_batch": max(16, plan.largest_tokens)})
    if not m.lora.enabled:
        out.append({"model.lora.enabled": True})
    if s.sharding == "none":
        out.append({"train.sharding": "fsdp2", "train.num_processes": _processes(r, shape, plan)})
    if s.reference:
        out.append({"algorithm.reference": "server"})
    splits = _split_sizes(r, shape, plan.gpus) if s.sharding in ("none", "fsdp2") else []
    if splits:  # the fewest processes a row that fit, else the most
        fitting = [n for n in splits if peak_of(_with(r, {"train.sequence_parallel": n}), shape, plan.gpus,
                                                plan.gpu_memory, plan.sharding) <= plan.gpu_memory]
        out.append({"train.sequence_parallel": (fitting or splits)[0 if fitting else -1]})
    if hasattr(t, "activation_offloading") and not t.activation_offloading:
        out.append({"train.activation_offloading": True})
    if r.generation.backend == "vllm":
        if hasattr(r.vllm, "sleep_mode") and not r.vllm.sleep_mode:
            out.append({"vllm.sleep_mode": 1})
        trainer = max(p.total for p in phases(shape, replace(s, engine_bytes=0)))
        share = math.floor((plan.gpu_memory - trainer) / plan.gpu_memory * 20) / 20
        if 0.05 <= share < r.vllm.gpu_memory_utilization:
            out.append({"vllm.gpu_memory_utilization": share})
    return out


def _processes(r: Recipe, shape: ModelShape, plan: Plan) -> int:
    """Processes to shard over: --gpus when more than one, else the fewest of 2, 4, 8 (dividing
    train.prompts_per_step) that fit, else the most of them."""
    if plan.gpus > 1:
        return plan.gpus
    valid = [n for n in (2, 4, 8) if r.train.prompts_per_step % n == 0] or [1]
    for n in valid:
        if peak_of(_with(r, {"train.sharding": "fsdp2", "train.num_processes": n}), shape, n, plan.gpu_memory,
                   "fsdp2") <= plan.gpu_memory:
            return n
    return valid[-1]


def _render(changes: dict[str, Any]) -> tuple[str, ...]:
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return v
        return "null" if v is None else str(v)

    return tuple(f"{k}={value(v)}" for k, v in changes.items() if v is not None)


def _gpus_for(changes: dict[str, Any], gpus: int) -> int:
    return int(changes.get("train.num_processes", gpus))


def _knobs(r: Recipe, shape: ModelShape, plan: Plan) -> tuple[Knob, ...]:
    out = []
    for changes in _candidates(r, shape, plan):
        gpus = _gpus_for(changes, plan.gpus)
        peak = peak_of(_with(r, changes), shape, gpus, plan.gpu_memory, _sharding(changes, plan))
        if peak < plan.peak.total:
            out.append(Knob(_render(changes), plan.peak.total - peak, peak <= plan.gpu_memory))
    return tuple(sorted(out, key=lambda k: -k.saves))


def _sharding(changes: dict[str, Any], plan: Plan) -> str | None:
    return changes.get("train.sharding", plan.sharding)


def _together(r: Recipe, shape: ModelShape, plan: Plan, knobs: tuple[Knob, ...]) -> tuple[str, ...]:
    """Knobs applied in order of what they save, those for one device first, until the recipe fits
    (empty when even all of them do not)."""
    changes: dict[str, Any] = {}
    chosen: list[str] = []
    best = plan.peak.total
    # what one device can do first (more devices only where that is not enough), each by what it saves
    for knob in sorted(knobs, key=lambda k: "train.num_processes" in k.text):
        if "train.micro_batch_size" in knob.text and "model.gradient_checkpointing=true" in chosen:
            continue  # the largest micro-batch was found without the knobs chosen before it
        trial = {**changes, **dict(o.split("=", 1) for o in knob.overrides)}
        typed = {k: _typed(v) for k, v in trial.items()}
        peak = peak_of(_with(r, typed), shape, _gpus_for(typed, plan.gpus), plan.gpu_memory, _sharding(typed, plan))
        if peak < best:
            changes, best = trial, peak
            chosen += knob.overrides
            if peak <= plan.gpu_memory:
                return tuple(chosen)
    return ()


def _typed(text: str) -> Any:
    """A rendered override value back as the value it stands for."""
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def check_fits(r: Recipe, *, gpus: int, gpu_memory: int, config: str | None = None,
               sharding: str | None = None) -> Plan:
    """`grpo train`'s check before a model loads on a GPU: the plan, or a UserError saying by how
    much the recipe does not fit and what would make it fit (train.memory_check = false skips it)."""
    from grpocli.planning.shapes import shape_of

    plan = make_plan(r, shape_of(r.model, config), gpus=gpus, gpu_memory=gpu_memory, sharding=sharding)
    if not plan.fits:
        raise not_fitting(plan, where="train.memory_check")
    return plan


def not_fitting(plan: Plan, *, where: str) -> UserError:
    knobs = "; ".join(f"{k.text} (saves {gib(k.saves)}{', fits' if k.fits else ''})" for k in plan.knobs[:6])
    together = " ".join(plan.together)
    return UserError(
        f"the recipe needs {gib(plan.peak.total)} per process in its {plan.peak.name} phase, more than the "
        f"{gib(plan.gpu_memory)} of each of {plan.gpus} device(s)",
        where=where,
        valid=f"at most {gib(plan.gpu_memory)}; what would lower it: {knobs or 'nothing grpo knows of'}",
        hint=(f"set {together}" if together else "a larger GPU, or more of them with train.sharding=fsdp2")
        + " (grpo plan RECIPE shows each phase; train.memory_check=false skips this check)",
    )


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / 2**20:.1f} MiB"
