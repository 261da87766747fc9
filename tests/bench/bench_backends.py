"""Benchmark: generation backends (hf, paged, vllm) on a real recipe, side by side (not part of the test run).

    python tests/bench/bench_backends.py                                  # smollm2_arithmetic, 1 thread
    python tests/bench/bench_backends.py --threads 1 2 --steps 5 --rounds 2 --backends hf paged vllm

Each trial is `grpo train RECIPE generation.backend=X train.steps=N train.torch_threads=T` in a fresh
process (OMP_NUM_THREADS=T, eval and rollouts off, checkpoint at the end only, deleted after); trials
alternate backends (hf, paged, vllm, hf, ...) so that load from other programs hits each alike. From
metrics.jsonl: `time/generation` (seconds per step) and completion tokens per generation second
(completions/mean_length x completions per step / time/generation); medians over steps 2..N of every
trial of a backend (step 1 is warm-up). The 1-minute load average is printed before and after each
trial: on a shared machine, compare only figures taken under similar load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def trial(backend: str, threads: int, a: argparse.Namespace, out: Path) -> list[dict]:
    """One training run; its metrics.jsonl rows."""
    cmd = [sys.executable, "-m", "grpocli.cli.app", "train", a.recipe, f"generation.backend={backend}",
           f"train.steps={a.steps}", f"train.output_dir={out}", f"train.torch_threads={threads}", "eval.every=0",
           "train.save_steps=0", "log.rollouts_every=0", "log.progress=none", "train.resume=never", *a.override]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"{backend} trial failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    gen = [r["time/generation"] for r in rows]
    print(f"  {backend:5s} threads={threads}: {len(rows)} steps in {time.perf_counter() - t0:.0f}s, "
          f"generation s/step {' '.join(f'{g:.1f}' for g in gen)}, load {load:.2f} -> {os.getloadavg()[0]:.2f}",
          flush=True)
    shutil.rmtree(out, ignore_errors=True)
    return rows


def summary(rows: list[dict], completions: int) -> tuple[float, float, float]:
    """Medians over steps 2..N: generation seconds per step, completion tokens per generation second, mean length."""
    later = [r for r in rows if r["step"] >= 2]
    seconds = statistics.median(r["time/generation"] for r in later)
    rates = statistics.median(r["completions/mean_length"] * completions / r["time/generation"] for r in later)
    return seconds, rates, statistics.median(r["completions/mean_length"] for r in later)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="smollm2_arithmetic")
    p.add_argument("--backends", nargs="+", default=["hf", "paged", "vllm"])
    p.add_argument("--threads", nargs="+", type=int, default=[1])
    p.add_argument("--steps", type=int, default=5, help="steps per trial (N >= 4: medians over 2..N)")
    p.add_argument("--rounds", type=int, default=1, help="trials of each backend, alternating")
    p.add_argument("--completions", type=int, default=64, help="completions per step (prompts x G of the recipe)")
    p.add_argument("--override", nargs="*", default=[], help="more section.key=value arguments for every trial")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-backends-"))
    for threads in a.threads:
        print(f"{a.recipe}, {threads} thread(s), {a.steps} steps x {a.rounds} round(s):", flush=True)
        rows: dict[str, list[dict]] = {b: [] for b in a.backends}
        for k in range(a.rounds):
            for backend in a.backends:
                rows[backend] += trial(backend, threads, a, work / f"{backend}-{threads}-{k}")
        base = summary(rows[a.backends[0]], a.completions)[0]
        print(f"  {'backend':8s} {'gen s/step':>10s} {'tokens/s':>9s} {'mean len':>8s} {f'vs {a.backends[0]}':>7s}")
        for backend in a.backends:
            seconds, rate, length = summary(rows[backend], a.completions)
            print(f"  {backend:8s} {seconds:10.2f} {rate:9.1f} {length:8.1f} {base / seconds:6.2f}x", flush=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
