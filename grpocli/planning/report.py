"""`grpo plan`'s output: a rich table per phase, the verdict, the largest micro-batch, the knobs."""

from __future__ import annotations

from typing import Any

from grpocli.planning.plan import Plan, gib


def render(plan: Plan, console: Any) -> None:
    """Print the plan on a rich Console."""
    from rich.markup import escape
    from rich.table import Table

    s, shape = plan.settings, plan.shape
    console.print(f"model: {shape.architecture} from {escape(shape.source)}: {shape.params:,} parameters, "
                  f"{shape.num_layers} layers, hidden {shape.hidden_size}, vocabulary {shape.vocab_size:,}"
                  + (f"; LoRA trains {s.lora_params:,}" if s.lora_params else ""))
    if plan.teacher is not None:
        console.print(teacher_line(plan, escape))
    if plan.auto:
        console.print('"auto", as `grpo train` would choose it on this memory: '
                      + ", ".join(f"{k} = {str(v).lower() if isinstance(v, bool) else v}" for k, v in plan.auto))
    t = s.train
    console.print(f"largest micro-batch (every prompt {plan.prompt_tokens} tokens, every completion "
                  f"{plan.completion_tokens}): {t.rows} row(s) x {t.width} tokens, {t.scored} scored; "
                  f"{s.micro_batches} micro-batch(es) a step on each of {s.processes} process(es)"
                  + (f", sharding {s.sharding}" if s.sharding != "none" and s.processes > 1 else ""))
    console.print(split_line(plan))
    for phase in plan.phases:
        table = Table(title=f"{phase.name}: {gib(phase.total)} per process", title_justify="left",
                      show_header=False, box=None, pad_edge=False)
        table.add_column("part")
        table.add_column("bytes", justify="right")
        for name, size in phase.parts:
            table.add_row(name, gib(size))
        console.print(table)
    where = f"{plan.gpus} x {gib(plan.gpu_memory)}" + (" (assumed: no CUDA device here; --gpu-memory sets it)"
                                                       if plan.memory_assumed else "")
    verdict = "[green]fits[/green]" if plan.fits else "[red]does not fit[/red]"
    console.print(f"peak: {plan.peak.name}, {gib(plan.peak.total)} per process: {verdict} on {where}")
    if plan.engine_cache is not None:
        console.print(plan.engine_cache.text(gib))
    if plan.largest_micro_batch:
        console.print(f"largest train.micro_batch_size whose log-prob and training phases fit: {plan.largest_micro_batch} "
                      f"(or train.max_tokens_per_micro_batch={plan.largest_tokens})")
    else:
        console.print("the log-prob and training phases do not fit even with train.micro_batch_size=1")
    if not plan.fits:
        console.print("what would lower the peak (each alone; paste after the recipe):")
        for knob in plan.knobs:
            console.print(f"  {knob.text}  saves {gib(knob.saves)}" + ("  (fits)" if knob.fits else ""))
        if plan.together:
            console.print(f"together these fit: {' '.join(plan.together)}")


def teacher_line(plan: Plan, escape: Any = str) -> str:
    """What the distillation teacher holds here: its weights (in process) or nothing (served)."""
    t, s = plan.settings.teacher, plan.settings
    if t is None:
        return f"teacher: served at {escape(plan.teacher or '')}: none here (its weights and passes are the server's)"
    weights = dict(plan.phases[-1].parts).get("teacher weights", 0)
    return (f"teacher: {t.architecture} from {escape(t.source)}: {t.params:,} parameters, {t.num_layers} layers, "
            f"hidden {t.hidden_size}, vocabulary {t.vocab_size:,}; in process: its weights ({gib(weights)} "
            f"per process, {s.teacher_bytes} bytes each) in every phase, its forward pass in the log-prob phase")


def split_line(plan: Plan) -> str:
    """The train.sequence_parallel the plan assumed, and what each process then holds of a row."""
    t = plan.settings.train
    if t.split <= 1:
        return "sequence parallel: train.sequence_parallel = 1 (each process holds its micro-batch's whole rows)"
    return (f"sequence parallel: train.sequence_parallel = {t.split}: each process holds 1/{t.split} of every row, "
            f"{t.local // t.rows} of its {t.width} tokens, and the logits of {t.local_scored} scored positions; "
            f"attention holds every token for 1/{t.split} of the heads"
            + (f", under the whole rows' mask ({t.mask:,} elements)" if t.mask else ""))
