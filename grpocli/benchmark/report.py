"""`grpo bench`'s figures: a table on the terminal, or one JSON line (`--json`, for scripts and the GPU kit)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from grpocli.benchmark.forecast import Forecast, measured
from grpocli.benchmark.measurement import PHASES, Measurement
from grpocli.benchmark.peak import Peak

LABELS = {"generation": "generation", "rewards": "rewards", "logprobs": "log-prob passes",
          "training": "training", "weight_sync": "weight sync", "other": "other"}


def figures(recipe: str, m: Measurement, peak: Peak, fc: Forecast) -> dict[str, Any]:
    """Everything measured, as plain numbers (the JSON line)."""
    rows = measured(m.steps)
    n = len(rows)
    seconds = {p: sum(r.phases[p] for r in rows) / n for p in PHASES}
    step_s = sum(r.seconds for r in rows) / n
    flops = {k: sum(r.flops[k] for r in rows) / n for k in ("generation", "logprobs", "training")}
    total_flops = sum(flops.values())
    own = sum(r.trained_tokens for r in rows) / n  # this process's (rank 0's)
    every = [p.trained_tokens for p in m.processes]  # several processes: each one's, by step
    trained = sum(sum(t.get(r.step, 0) for t in every) for r in rows) / n if every else own
    tokens = {  # over every process (generation's count already is)
        "generation": sum(r.completion_tokens for r in rows) / n,
        "logprobs": trained if flops["logprobs"] else 0.0,
        "training": trained,
    }
    generated = (sum(m.processes[0].completion_tokens.get(r.step, 0.0) for r in rows) / n if m.processes
                 else tokens["generation"])
    per_process = {"generation": generated, "logprobs": own if flops["logprobs"] else 0.0, "training": own}
    achieved = total_flops / step_s if step_s else 0.0
    peaks = [p.peak_memory for p in m.processes] or [max(r.peak_memory for r in m.steps)]

    def rates(counts: dict[str, float]) -> dict[str, float]:
        return {k: (counts[k] / seconds[k] if seconds[k] else 0.0) for k in counts}

    return {
        "recipe": recipe, "steps_run": len(m.steps), "steps_measured": n, "parameters": m.parameters,
        "dtype": m.dtype, "device": m.device, "backend": m.backend, "startup_s": m.startup_s,
        "processes": max(len(m.processes), 1), "sequence_parallel": m.sequence_parallel,
        "s_per_step": step_s, "phases_s": seconds,
        "tokens_per_s": rates(tokens),
        "tokens_per_s_per_process": rates(per_process),
        "completion_tokens_per_s": tokens["generation"] / step_s if step_s else 0.0,
        "mean_completion_length": sum(r.mean_completion for r in rows) / n,
        "flops_per_step": total_flops, "flops_per_step_by_phase": flops,
        "achieved_flops_per_s": achieved, "peak_flops_per_s": peak.flops_per_s,
        "peak_device": peak.device, "peak_dtype": peak.dtype, "mfu": achieved / peak.flops_per_s,
        "peak_memory_bytes": max(peaks), "peak_memory_kind": m.memory_kind,
        "peak_memory_by_step": [r.peak_memory for r in m.steps], "peak_memory_by_process": peaks,
        "weight_sync_bytes": m.sync_bytes,
        "idle_share": {"trainer": sum(r.trainer_idle for r in rows) / n / step_s if step_s else 0.0,
                       "engine": sum(r.engine_idle for r in rows) / n / step_s if step_s else 0.0},
        "evaluation_s": m.evaluation_s, "checkpoint_s": m.checkpoint_s,
        "forecast": asdict(fc), "notes": m.notes,
    }


def _si(x: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.2f} "


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return (f"{h}:" if h else "") + f"{rest // 60:02d}:{rest % 60:02d}"


def processes_text(f: dict[str, Any]) -> str:
    """"2 processes, sequence_parallel 2"; "one process"."""
    n = f.get("processes", 1)
    return "one process" if n == 1 else f"{n} processes, sequence_parallel {f.get('sequence_parallel', 1)}"


def text(f: dict[str, Any]) -> str:
    fc = f["forecast"]
    several = f.get("processes", 1) > 1
    lines = [
        f"grpo bench {f['recipe']}: {f['steps_run']} steps, step 1 warm-up, figures are means of the "
        f"{f['steps_measured']} after it" + (f"; {processes_text(f)}" if several else ""),
        f"model {f['parameters'] / 1e6:.1f}M parameters, {f['dtype']} on {f['device']}; generation {f['backend']}; "
        f"start-up {f['startup_s']:.1f} s",
        "",
        f"  {'phase':16s} {'s/step':>8s} {'share':>6s} {'tokens/s':>10s} {'FLOPs/step':>14s}",
    ]
    for p in PHASES:
        s = f["phases_s"][p]
        tps = f["tokens_per_s"].get(p)
        fl = f["flops_per_step_by_phase"].get(p)
        lines.append(f"  {LABELS[p]:16s} {s:8.3f} {s / f['s_per_step']:6.1%} "
                     f"{(f'{tps:10.1f}' if tps else ' ' * 10)} {(_si(fl) + 'FLOP' if fl else ''):>14s}")
    lines += [
        f"  {'step':16s} {f['s_per_step']:8.3f} {'':6s} {f['completion_tokens_per_s']:10.1f} "
        f"{_si(f['flops_per_step']) + 'FLOP':>14s}",
        "  (tokens/s: generation counts completion tokens; log-prob passes and training count the trained "
        "groups' tokens, prompt once per group)",
        *([f"  (tokens/s over all {f['processes']} processes; rank 0's own: "
           + ", ".join(f"{LABELS[k]} {v:.1f}" for k, v in f["tokens_per_s_per_process"].items() if v)
           + "; FLOPs and MFU are rank 0's)"] if several else []),
        f"idle: the trainer waited for generation {f['idle_share']['trainer']:.1%} of a step, the generation "
        f"engine had nothing to generate {f['idle_share']['engine']:.1%}",
        *([f"weight sync: {f['phases_s']['weight_sync']:.3f} s and {f['weight_sync_bytes'] / 1e6:.2f} MB a sync"]
          if f.get("weight_sync_bytes") else []),
        "",
        f"achieved {_si(f['achieved_flops_per_s'])}FLOP/s; measured matmul peak {_si(f['peak_flops_per_s'])}FLOP/s "
        f"({f['peak_device']}, {f['peak_dtype']}); MFU {f['mfu']:.1%}",
        f"peak memory {f['peak_memory_bytes'] / 2**30:.2f} GiB ({f['peak_memory_kind']}"
        + ("; the largest of the processes: " + ", ".join(f"{b / 2**30:.2f}" for b in f["peak_memory_by_process"])
           + " GiB" if several else "")
        + f"); {'rank 0 ' if several else ''}after each step: "
        + ", ".join(f"{b / 2**30:.2f}" for b in f["peak_memory_by_step"]) + " GiB",
        "",
        f"forecast for train.steps = {fc['steps']}: {_clock(fc['total_s'])} "
        f"(start-up {f['startup_s']:.0f} s + {fc['steps']} x {fc['s_per_step']:.2f} s"
        + (f" + {fc['evaluations']} evaluation(s) x {f['evaluation_s']:.1f} s" if f["evaluation_s"] is not None
           and fc["evaluations"] else "")
        + (f" + {fc['checkpoints']} checkpoint(s) x {f['checkpoint_s']:.1f} s" if f["checkpoint_s"] is not None else
           " ; evaluations and checkpoints not measured")
        + ")",
        f"  lengths now: {fc['lengths']}; measured {fc['measured_s_per_step']:.2f} s a step; "
        f"if every completion reaches max_completion_length: {fc['s_per_step_at_max']:.2f} s a step, "
        f"{_clock(fc['total_at_max_s'])} in all",
    ]
    lines += [f"note: {n}" for n in f["notes"]]
    return "\n".join(lines)
