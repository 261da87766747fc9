"""N real steps of a recipe in this process, every phase clocked: the trainer's own Loop, observed.

The loop reports each optimizer step to a `StepMeter` (grpocli.trainer.observer.StepRecord: its
phase seconds, wall time and the token counts of each pass); the meter turns it into a
`MeasuredStep` with the step's FLOPs (grpocli.benchmark.flops, from the model's exact shape) and
the peak memory so far. Phase seconds are the ones the step writes to metrics.jsonl
(time/generation, time/rewards, time/logprobs, time/training, time/weight_sync); `other` is the
rest of the step's wall time (advantages, batching, metrics, rollouts files). Evaluation and
checkpoints are kept out of the steps (`Loop(steps_only=True)`) and, unless asked not to, measured
once each afterwards.

Under several processes (grpocli.benchmark.processes) every process runs this; the step records are
each process's own (its share of the batch, its phase seconds), and after the steps every process's
peak memory and token counts are gathered (one gather_object) into `Measurement.processes`.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from typing import Any

from grpocli.benchmark.flops import groups_of, passes_flops, training_passes
from grpocli.errors import UserError
from grpocli.planning import ModelShape, shape_of_config
from grpocli.recipe import Resolved
from grpocli.trainer.loop import Loop
from grpocli.trainer.observer import StepRecord
from grpocli.trainer.session import Session

PHASES = ("generation", "rewards", "logprobs", "training", "weight_sync", "other")


@dataclass(frozen=True)
class MeasuredStep:
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
    trainer_idle: float = 0.0       # seconds of the step the trainer waited for generation
    engine_idle: float = 0.0        # seconds of the step the generation engine had nothing to generate
    overlapped: bool = False        # generated beside training (async_steps, pipeline "inflight")


@dataclass(frozen=True)
class ProcessFigures:
    """One process's share of a multi-process bench, gathered after the steps."""

    rank: int
    peak_memory: int                      # bytes, after the steps (as MeasuredStep.peak_memory)
    trained_tokens: dict[int, int]        # step -> tokens of its groups that entered the loss
    completion_tokens: dict[int, float]   # step -> tokens it generated (the step's share of the cycle's)


@dataclass
class Measurement:
    steps: list[MeasuredStep]
    startup_s: float                # from the command's start to the first step's start
    shape: ModelShape | None        # grpo plan's shape of the policy (None: not known)
    parameters: int
    dtype: str
    device: str
    memory_kind: str                # what peak_memory counts
    evaluation_s: float | None = None   # one periodic evaluation (None: none in the recipe, or not measured)
    checkpoint_s: float | None = None   # one checkpoint save (None: not measured)
    backend: str = ""
    notes: list[str] = field(default_factory=list)
    sync_bytes: float | None = None     # the last weight sync's bytes (None: the backend does not say)
    processes: list[ProcessFigures] = field(default_factory=list)  # [N] rank order; empty: one process
    sequence_parallel: int = 1          # train.sequence_parallel the processes ran with


def measured_step(record: StepRecord, shape: ModelShape, *, lora: bool, peak: int) -> MeasuredStep:
    """What the loop reported of one step, with its FLOPs: the cycle's generation and frozen log-prob
    passes in equal shares over its steps, the step's own training passes (none for a skipped update)."""
    generated = groups_of(record.generated)
    trained = groups_of(record.trained)
    frozen = sum(passes_flops(shape, groups_of(f.lengths), passes=f.passes) for f in record.frozen)
    flops = {"generation": passes_flops(shape, generated) / record.cycle_steps,
             "logprobs": frozen / record.cycle_steps,
             "training": 0.0 if record.skipped else passes_flops(shape, trained, passes=training_passes(lora))}
    s = record.seconds
    phases = {"generation": s["time/generation"], "rewards": s["time/rewards"], "logprobs": s["time/logprobs"],
              "training": s["time/training"], "weight_sync": s["time/weight_sync"], "other": record.other}
    lengths = record.generated.completions
    o = record.overlap
    if o is None:  # generated in the step: the trainer waits for all of it, the engine idles the rest
        trainer_idle, engine_idle = phases["generation"], max(record.wall - phases["generation"], 0.0)
    else:          # beside training: what each reported, the cycle's in equal shares
        trainer_idle, engine_idle = o.waited / record.cycle_steps, o.engine_idle / record.cycle_steps
    return MeasuredStep(
        trainer_idle=trainer_idle, engine_idle=engine_idle, overlapped=o is not None,
        step=record.step, seconds=record.wall, phases=phases, completion_tokens=record.completion_tokens,
        longest_completion=max(lengths, default=0), mean_completion=sum(lengths) / max(len(lengths), 1),
        trained_tokens=sum(grp.tokens for grp in trained),
        trained_completion_tokens=sum(sum(grp.completions) for grp in trained), flops=flops, peak_memory=peak)


class StepMeter:
    """Watches the training loop (a grpocli.trainer.observer.StepObserver): each step it reports,
    measured, with the peak memory after it."""

    def __init__(self, shape: ModelShape, policy: Any, *, lora: bool) -> None:
        self.shape, self.policy, self.lora = shape, policy, lora
        self.steps: list[MeasuredStep] = []
        self.generated: dict[int, float] = {}  # step -> this process's own generated tokens (its share)

    def on_step(self, record: StepRecord) -> None:
        self.steps.append(measured_step(record, self.shape, lora=self.lora, peak=peak_memory(self.policy)[0]))
        self.generated[record.step] = sum(record.generated.completions) / record.cycle_steps

    def figures(self, rank: int) -> ProcessFigures:
        """This process's figures, to gather."""
        return ProcessFigures(rank=rank, peak_memory=peak_memory(self.policy)[0],
                              trained_tokens={r.step: r.trained_tokens for r in self.steps},
                              completion_tokens=dict(self.generated))


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
        policy, r = s.policy, s.recipe
        shape = shape_of_config(policy.config, source="the policy's config",
                                trust_remote_code=r.model.trust_remote_code)
        if forced:
            force_lengths(s)
        meter = StepMeter(shape, policy, lora=r.model.lora.enabled)
        loop = Loop(s, observer=meter, steps_only=True)
        startup = time.perf_counter() - started
        loop.run()
        # every process's peak and tokens (one gather; all processes are here, the steps done)
        processes = s.parallel.gather_rows([meter.figures(s.parallel.rank)]) if s.parallel.size > 1 else []
        p = next(policy.parameters())
        m = Measurement(steps=meter.steps, startup_s=startup, shape=shape,
                        parameters=sum(x.numel() for x in policy.parameters()),
                        dtype=str(p.dtype).removeprefix("torch."), device=str(p.device),
                        memory_kind=peak_memory(policy)[1],
                        backend=type(s.backend).__name__,
                        sync_bytes=(getattr(s.backend, "last_sync", None) or {}).get("bytes"),
                        processes=processes, sequence_parallel=r.train.sequence_parallel)
        if extras and loop.evaluation is not None:
            t0 = time.perf_counter()
            loop.evaluation.run(s.state.step)
            m.evaluation_s = time.perf_counter() - t0
        if extras:
            t0 = time.perf_counter()
            loop.maybe_checkpoint(now=True)
            m.checkpoint_s = time.perf_counter() - t0
        return m
    finally:
        if loop is not None:
            loop.close()
        s.close()
