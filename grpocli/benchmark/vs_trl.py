"""`grpo bench RECIPE --vs-trl`: grpo and TRL's GRPOTrainer at equal work (grpocli.benchmark.workers),
each trial a fresh process so its peak memory is its own, alternating grpo, TRL, grpo, TRL, ... so
that load from other programs hits both alike. Step 1 of each trial is warm-up; figures are
medians over steps 2..N of all trials of a framework. The load average is noted with every trial:
on a shared machine, compare only figures taken under similar load.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from grpocli.errors import UserError

PHASES = ("generation", "logprobs", "loss_backward", "optimizer", "weight_sync", "other")


def trial(framework: str, recipe: str, overrides: list[str], steps: int, *, python: str,
          threads: int | None, timeout: float) -> dict[str, Any]:
    cmd = [python, "-m", "grpocli.benchmark.workers", framework, recipe, "--steps", str(steps),
           *(f"--override={o}" for o in overrides)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise UserError(f"the {framework} trial of `grpo bench --vs-trl` ran past {timeout:.0f} s",
                        where="--timeout", hint="fewer --steps, a smaller model or a longer --timeout") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("BENCH ")]
    if done.returncode or not lines:
        raise UserError(f"the {framework} trial failed (exit {done.returncode}): {' '.join(cmd)}\n"
                        + (done.stderr or done.stdout)[-3000:],
                        hint="run that command to see the whole output")
    result = json.loads(lines[-1][len("BENCH "):])
    result["load_before"], result["wall_s"] = load, time.perf_counter() - t0
    return result


def summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    steps = [s for t in trials for s in (t["steps"][1:] or t["steps"])]  # step 1 is warm-up
    med = {p: statistics.median(s[p] for s in steps) for p in (*PHASES, "total")}
    out = {
        "steps_per_s": 1.0 / med["total"],
        "tokens_per_s": statistics.median(s["completion_tokens"] / s["total"] for s in steps),
        "phases_s": med,
        "peak_rss_step1_mib": statistics.median(t["peak_rss_kib"][0] for t in trials) / 1024,
        "peak_rss_mib": statistics.median(t["peak_rss_kib"][-1] for t in trials) / 1024,
        "parameters": trials[0]["parameters"], "backend": trials[0]["backend"], "threads": trials[0]["threads"],
        "load": statistics.median(t["load_before"] for t in trials),
    }
    if trials[0].get("cuda_max_allocated"):
        out["cuda_max_allocated_gib"] = statistics.median(t["cuda_max_allocated"][-1] for t in trials) / 2**30
    return out


def compare(recipe: str, overrides: list[str], *, steps: int, repeats: int, python: str | None = None,
            threads: int | None = None, timeout: float = 600,
            say: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Alternating trials; the summaries of both and the ratio grpo / TRL of steps per second."""
    trials: dict[str, list[dict[str, Any]]] = {"grpo": [], "trl": []}
    for _ in range(repeats):
        for fw in ("grpo", "trl"):
            t = trial(fw, recipe, overrides, steps, python=python or sys.executable, threads=threads, timeout=timeout)
            say(f"  {fw:4s}: {len(t['steps'])} steps in {t['wall_s']:.0f} s, load {t['load_before']:.2f}")
            trials[fw].append(t)
    results = {fw: summary(t) for fw, t in trials.items()}
    return {"recipe": recipe, "overrides": overrides, "steps": steps, "repeats": repeats, "summary": results,
            "ratio_steps_per_s": results["grpo"]["steps_per_s"] / results["trl"]["steps_per_s"],
            "trials": trials}


def text(out: dict[str, Any]) -> str:
    res = out["summary"]
    g = res["grpo"]
    lines = [
        f"grpo bench {out['recipe']} --vs-trl: {out['repeats']} trials x {out['steps']} steps each, alternating, "
        f"median of steps 2..N; {g['parameters'] / 1e6:.1f}M parameters, {g['threads']} torch threads",
        f"grpo generation: {g['backend']}; TRL generation: transformers; every completion forced to "
        "max_completion_length; loss dapo, beta 0, one iteration, constant learning rate (both)",
        f"{'framework':9s} {'steps/s':>8s} {'tokens/s':>9s} " + " ".join(f"{p[:10]:>10s}" for p in PHASES)
        + "  peak RSS MiB  load",
    ]
    for fw, r in res.items():
        ph = " ".join(f"{r['phases_s'][p]:10.3f}" for p in PHASES)
        lines.append(f"{fw:9s} {r['steps_per_s']:8.3f} {r['tokens_per_s']:9.0f} {ph} {r['peak_rss_mib']:13.0f} "
                     f"{r['load']:5.2f}")
    lines.append(f"ratio grpo/TRL steps per second: {out['ratio_steps_per_s']:.2f}  "
                 "(phase columns: median seconds per step)")
    return "\n".join(lines)
