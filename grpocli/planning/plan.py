"""The plan of a recipe: per-phase memory, the peak, whether it fits, the largest micro-batch that
does, and the knobs that would make it fit (each a `key=value` to paste, with what it saves).

Settings are read from the recipe as the trainer uses them: the micro-batch of the worst case
(every prompt data.max_prompt_length tokens long, every completion generation.max_completion_length),
laid out as grpocli.algorithms.packing lays it out (shared prompts under sdpa up to 4 x hidden
tokens a row, padded rows beyond, packed rows with flash-attention); keys added by later versions
(train.activation_offloading, vllm.sleep_mode, train.logprob_micro_batch_size) are read where present.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError
from grpocli.planning.engine_cache import EngineCache, engine_cache
from grpocli.planning.memory import F32, Phase, Settings, Tokens, phases
from grpocli.planning.shapes import ModelShape, dtype_bytes

if TYPE_CHECKING:
    from grpocli.recipe.schema import Recipe

GIB = 2**30
#: Shared-prompt rows up to this many times the hidden size (grpocli.algorithms.packing.DENSE_ROW_FACTOR).
DENSE_ROW_FACTOR = 4
#: Completions per generate call of the 'hf' backend (grpocli.generation.hf.HFBackend's batch_size).
HF_BATCH = 64
#: The bound the search for the largest micro-batch stops at.
MAX_SEARCH = 4096


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
            "largest_micro_batch_size": self.largest_micro_batch,
            "largest_max_tokens_per_micro_batch": self.largest_tokens,
            "knobs": [{"set": list(k.overrides), "saves_bytes": k.saves, "fits": k.fits} for k in self.knobs],
            "fits_with": list(self.together),
            "engine_kv_cache": None if self.engine_cache is None else {
                "sequences": self.engine_cache.sequences, "generation_batches": self.engine_cache.batches,
                "needed_bytes": self.engine_cache.needed, "available_bytes": self.engine_cache.available,
                "lora_bytes": self.engine_cache.lora, "sync_bytes": self.engine_cache.sync,
                "merged_sync_bytes": self.engine_cache.merged},
        }


# -- from the recipe ---------------------------------------------------------------------------
def settings_of(r: Recipe, shape: ModelShape, *, gpus: int, gpu_memory: int, sharding: str | None = None) -> Settings:
    """The memory model's settings for recipe `r` on `gpus` processes of `gpu_memory` bytes each
    (`sharding`: what the processes run, where accelerate's config decides: 'zero2', 'zero3', 'fsdp2')."""
    t, a, m = r.train, r.algorithm, r.model
    weight = dtype_bytes(m.dtype if m.dtype != "auto" else shape.config_dtype)
    compute = 2 if t.mixed_precision in ("bf16", "fp16") else weight
    sharding = (sharding or t.sharding) if gpus > 1 else "none"
    per_process = t.prompts_per_step * r.generation.num_generations // max(gpus, 1)
    train_rows = _rows(t.micro_batch_size, t.max_tokens_per_micro_batch, r, per_process)
    logprob_rows = getattr(t, "logprob_micro_batch_size", None) or train_rows
    linears = [lin for lin in shape.layer_linears
               if m.lora.target_modules == "all-linear" or any(lin.name.endswith(x) for x in m.lora.target_modules)]
    backend = r.generation.backend
    engine = int(r.vllm.gpu_memory_utilization * gpu_memory) if backend == "vllm" else 0
    return Settings(
        weight_bytes=weight, compute_bytes=compute,
        lora_params=shape.lora_params(m.lora.r, m.lora.target_modules) if m.lora.enabled else 0,
        lora_rank=m.lora.r if m.lora.enabled else 0, lora_linears=len(linears) if m.lora.enabled else 0,
        gradient_checkpointing=m.gradient_checkpointing,
        activation_offloading=bool(getattr(t, "activation_offloading", False)),
        reference=a.beta > 0 and a.reference != "server", processes=max(gpus, 1), sharding=sharding,
        micro_batches=math.ceil(per_process / train_rows) if per_process else 1,
        train=tokens_of(r, shape, train_rows), logprob=tokens_of(r, shape, min(logprob_rows, max(per_process, 1))),
        entropy_grad=a.entropy_coef > 0, engine_bytes=engine, engine_sleeps=int(getattr(r.vllm, "sleep_mode", 0)) > 0,
        generation_bytes=_hf_generation(r, shape, compute, per_process) if backend in ("hf", "paged") else 0,
    )


def _rows(micro_batch_size: int, max_tokens: int | None, r: Recipe, per_process: int) -> int:
    """Sequences in the largest micro-batch: micro_batch_size, or as many full-length ones as the token budget holds."""
    if max_tokens is not None:
        length = r.data.max_prompt_length + r.generation.max_completion_length
        return max(1, min(max_tokens // length, max(per_process, 1)))
    return max(1, min(micro_batch_size, max(per_process, 1)))


def tokens_of(r: Recipe, shape: ModelShape, n: int) -> Tokens:
    """The forward pass of n full-length sequences as grpocli.algorithms.packing lays them out."""
    lp, lc, g = r.data.max_prompt_length, r.generation.max_completion_length, r.generation.num_generations
    attn = r.model.attn_implementation or "sdpa"
    if "flash" in attn:  # packed: one row, no mask
        return Tokens(rows=1, width=n * (lp + lc - 1), scored=n * lc)
    if attn in ("sdpa", "eager"):
        groups = max(len({i // g for i in range(k, k + n)}) for k in range(0, max(n, g), n))
        width = groups * lp + n * (lc - 1)
        if width <= DENSE_ROW_FACTOR * shape.hidden_size:
            return Tokens(rows=1, width=width, scored=n * lc, mask=width * width)
    width = lp + lc - 1
    return Tokens(rows=n, width=width, scored=n * lc, mask=n * width * width)


def _hf_generation(r: Recipe, shape: ModelShape, compute: int, per_process: int) -> int:
    """transformers' generate, HF_BATCH completions a call (whole groups, at least one), or, for
    'paged', every completion of the generation batch at once (its cache is sized to hold them all,
    grpocli.generation.paged): the KV cache and one step's float32 logits."""
    length = r.data.max_prompt_length + r.generation.max_completion_length
    g = r.generation.num_generations
    every = per_process * r.train.steps_per_generation
    batch = every if r.generation.backend == "paged" else min(max(1, HF_BATCH // g) * g, every)
    kv = batch * length * shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim * compute
    return kv + batch * shape.vocab_size * F32


# -- the plan ----------------------------------------------------------------------------------
def make_plan(r: Recipe, shape: ModelShape, *, gpus: int, gpu_memory: int, memory_assumed: bool = False,
              knobs: bool = True, sharding: str | None = None) -> Plan:
    """The plan of `r` on `gpus` devices of `gpu_memory` bytes (`knobs`: look for what would make it fit)."""
    s = settings_of(r, shape, gpus=gpus, gpu_memory=gpu_memory, sharding=sharding)
    plan = Plan(shape=shape, settings=s, phases=phases(shape, s), gpus=gpus, gpu_memory=gpu_memory,
                memory_assumed=memory_assumed, largest_micro_batch=0, largest_tokens=0, sharding=sharding,
                prompt_tokens=r.data.max_prompt_length, completion_tokens=r.generation.max_completion_length,
                engine_cache=engine_cache(r, shape, gpus=gpus, gpu_memory=gpu_memory))
    largest = _largest_micro_batch(r, shape, gpus, gpu_memory, sharding)
    length = r.data.max_prompt_length + r.generation.max_completion_length
    plan = replace(plan, largest_micro_batch=largest, largest_tokens=largest * length)
    if knobs and not plan.fits:
        found = _knobs(r, shape, plan)
        plan = replace(plan, knobs=found, together=_together(r, shape, plan, found))
    return plan


def peak_of(r: Recipe, shape: ModelShape, gpus: int, gpu_memory: int, sharding: str | None = None,
            *, training_only: bool = False) -> int:
    """The largest phase's bytes per process (`training_only`: of the log-prob and training phases)."""
    s = settings_of(r, shape, gpus=gpus, gpu_memory=gpu_memory, sharding=sharding)
    return max(p.total for p in phases(shape, s)[1 if training_only else 0:])


def _largest_micro_batch(r: Recipe, shape: ModelShape, gpus: int, gpu_memory: int, sharding: str | None) -> int:
    """The largest train.micro_batch_size (no token budget) whose log-prob and training phases fit; 0 when
    1 does not."""
    per_process = max(1, r.train.prompts_per_step * r.generation.num_generations // max(gpus, 1))

    def fits(n: int) -> bool:
        return peak_of(_with(r, {"train.micro_batch_size": n, "train.max_tokens_per_micro_batch": None}),
                       shape, gpus, gpu_memory, sharding, training_only=True) <= gpu_memory

    if not fits(1):
        return 0
    lo, hi = 1, min(per_process, MAX_SEARCH)
    while lo < hi:  # the peak grows with the micro-batch
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def _with(r: Recipe, changes: dict[str, Any]) -> Recipe:
    """A copy of `r` with dotted keys changed (no validation beyond the types: the values are the plan's own)."""
    sections: dict[str, dict[str, Any]] = {}
    for key, value in changes.items():
        section, _, name = key.partition(".")
        sections.setdefault(section, {})[name] = value
    update = {}
    for section, values in sections.items():
        current = getattr(r, section)
        nested = {k: v for k, v in values.items() if "." not in k}
        for k, v in values.items():
            if "." in k:
                sub, _, leaf = k.partition(".")
                nested[sub] = getattr(current, sub).model_copy(update={leaf: v})
        update[section] = current.model_copy(update=nested)
    return r.model_copy(update=update)


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
