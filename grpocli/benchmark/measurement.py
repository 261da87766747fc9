"""N real steps of a recipe in this process, every phase clocked: the trainer's own Loop, with the
step's token counts (for FLOPs) and peak memory taken as each step is recorded.

Phase seconds are the ones the step writes to metrics.jsonl (time/generation, time/rewards,
time/logprobs, time/training, time/weight_sync: grpocli.trainer.loop); `other` is the rest of the
step's wall time (advantages, batching, metrics, rollouts files). Evaluation and checkpoints are
kept out of the steps and, unless asked not to, measured once each afterwards.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from typing import Any

from grpocli.benchmark.flops import ModelShape, group_tokens, passes_flops, training_passes
from grpocli.errors import UserError
from grpocli.recipe import Resolved
from grpocli.reference.client import ReferenceClient
from grpocli.trainer.loop import Batch, Loop, Slice
from grpocli.trainer.session import Session

PHASES = ("generation", "rewards", "logprobs", "training", "weight_sync", "other")


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step as measured (a cycle's once-per-cycle work in equal shares, as metrics.jsonl)."""

    step: int
    seconds: float                  # wall time since the previous step was recorded
    phases: dict[str, float]        # PHASES -> seconds
    completion_tokens: float        # generated (the model's tokens)
    longest_completion: int         # of the generation batch
    mean_completion: float
    trained_tokens: int             # tokens of the groups that entered the loss (prompt once per group)
    trained_completion_tokens: int  # of which completion tokens
    flops: dict[str, float]         # generation, logprobs, training
    peak_memory: int                # bytes, so far (see Measurement.memory_kind)


@dataclass
class Measurement:
    steps: list[StepRecord]
    startup_s: float                # from the command's start to the first step's start
    shape: ModelShape
    parameters: int
    dtype: str
    device: str
    memory_kind: str                # what peak_memory counts
    evaluation_s: float | None = None   # one periodic evaluation (None: none in the recipe, or not measured)
    checkpoint_s: float | None = None   # one checkpoint save (None: not measured)
    backend: str = ""
    notes: list[str] = field(default_factory=list)


class BenchLoop(Loop):
    """The trainer's Loop, unchanged, with each step's tokens, FLOPs, time and memory noted."""

    def __init__(self, s: Session, shape: ModelShape) -> None:
        super().__init__(s)
        self.shape, self.records = shape, []
        self._cycle: dict[str, Any] = {}
        self._train_flops = 0.0
        self._last = time.perf_counter()

    def generate(self) -> Batch:
        batch = super().generate()
        r = batch.scored.rollouts
        lengths = [int(n) for n in r.model_lengths().tolist()]
        groups = group_tokens(r.prompt_ids, lengths)
        self._cycle = {"generation": passes_flops(self.shape, groups), "longest": max(lengths, default=0),
                       "mean": sum(lengths) / max(len(lengths), 1)}
        return batch

    def prepare(self, batch: Batch) -> list[Slice]:
        slices = super().prepare(batch)
        s, r = self.s, self.s.recipe
        frozen, trained = 0.0, {}
        for sl in slices:
            groups = group_tokens(sl.scored.rollouts.prompt_ids, sl.scored.rollouts.completion_lengths().tolist(),
                                  sl.advantages.keep.tolist())
            local_ref = sl.frozen.ref_logp is not None and not isinstance(s.reference, ReferenceClient)
            frozen += passes_flops(self.shape, groups, passes=(sl.frozen.old_logp is not None) + local_ref)
            trained[id(sl)] = groups
        steps = min(len(slices) * r.algorithm.num_iterations, r.train.steps - s.state.step)
        self._cycle.update(logprobs=frozen, steps=max(steps, 1), trained=trained)
        return slices

    def update(self, sl: Slice) -> dict[str, float]:
        stats = super().update(sl)
        groups = self._cycle["trained"].get(id(sl), [])
        lora = self.s.recipe.model.lora.enabled
        self._train_flops = 0.0 if stats.get("skipped") else passes_flops(self.shape, groups,
                                                                           passes=training_passes(lora))
        self._trained = (sum(grp.tokens for grp in groups), sum(sum(grp.completions) for grp in groups))
        return stats

    def record(self, batch: Batch, sl: Slice, stats: dict[str, float], shares: dict[str, float], *,
               completion_tokens: float) -> None:
        super().record(batch, sl, stats, shares, completion_tokens=completion_tokens)
        now, c = time.perf_counter(), self._cycle
        phases = {"generation": shares["time/generation"], "rewards": shares["time/rewards"],
                  "logprobs": shares["time/logprobs"], "training": stats["time/training"],
                  "weight_sync": shares["time/weight_sync"]}
        seconds = now - self._last
        phases["other"] = max(seconds - sum(phases.values()), 0.0)
        flops = {"generation": c["generation"] / c["steps"], "logprobs": c["logprobs"] / c["steps"],
                 "training": self._train_flops}
        self.records.append(StepRecord(
            step=self.s.state.step, seconds=seconds, phases=phases, completion_tokens=completion_tokens,
            longest_completion=c["longest"], mean_completion=c["mean"], trained_tokens=self._trained[0],
            trained_completion_tokens=self._trained[1],
            flops=flops, peak_memory=peak_memory(self.s.policy)[0]))
        self._last = time.perf_counter()

    def maybe_evaluate(self, *, since: int) -> None:  # measured once, after the steps
        pass

    def maybe_checkpoint(self, *, now: bool = False) -> None:  # measured once, after the steps
        pass


def peak_memory(model: Any) -> tuple[int, str]:
    """(bytes, what they count): CUDA's max_memory_allocated where the model is on a GPU, else this
    process's peak resident set (Linux ru_maxrss)."""
    import torch

    device = next(model.parameters()).device
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "torch.cuda.max_memory_allocated (this process)"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "peak RSS of this process (CPU)"


def eos_ids(model: Any) -> list[int]:
    eos = model.generation_config.eos_token_id
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def force_lengths(s: Session) -> None:
    """Every completion exactly generation.max_completion_length tokens: EOS suppressed (transformers'
    `suppress_tokens`), or on the colocated vLLM engine `min_tokens = max_tokens` and `ignore_eos`."""
    backend = s.recipe.generation.backend
    engine = getattr(s.backend, "engine", None)
    if engine is not None and hasattr(engine, "llm"):
        generate = engine.llm.generate

        def forced_generate(prompts, params, *args, **kwargs):
            params.min_tokens, params.ignore_eos = params.max_tokens, True
            return generate(prompts, params, *args, **kwargs)

        engine.llm.generate = forced_generate
    elif backend in ("hf", "auto"):
        s.policy.generation_config.suppress_tokens = eos_ids(s.policy)
    else:
        raise UserError(f"forced completion lengths need generation.backend = \"hf\" or \"vllm\", not {backend!r}",
                        where="generation.backend", valid="hf, vllm",
                        hint="run without --forced-lengths, or with generation.backend=hf")


def measure(resolved: Resolved, *, started: float, extras: bool = True, forced: bool = False) -> Measurement:
    """Run the recipe's train.steps steps here (the caller sets them and a scratch output_dir)."""
    s = Session.open(resolved)
    loop = None
    try:
        policy = s.policy
        shape = ModelShape.of(policy.config)
        if forced:
            force_lengths(s)
        loop = BenchLoop(s, shape)
        startup = time.perf_counter() - started
        loop._last = time.perf_counter()
        loop.run()
        p = next(policy.parameters())
        m = Measurement(steps=loop.records, startup_s=startup, shape=shape,
                        parameters=sum(x.numel() for x in policy.parameters()), dtype=str(p.dtype).removeprefix("torch."),
                        device=str(p.device), memory_kind=peak_memory(policy)[1],
                        backend=type(s.backend).__name__)
        if extras and loop.evaluation is not None:
            t0 = time.perf_counter()
            loop.evaluation.run(s.state.step)
            m.evaluation_s = time.perf_counter() - t0
        if extras:
            t0 = time.perf_counter()
            Loop.maybe_checkpoint(loop, now=True)
            m.checkpoint_s = time.perf_counter() - t0
        return m
    finally:
        if loop is not None:
            loop.close()
        s.close()
