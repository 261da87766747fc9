"""The old benchmark's command line over `grpo bench RECIPE --vs-trl` (the work moved into
grpocli/benchmark, so the command runs from an installed grpo; docs/benchmarks.md, "Throughput").

    python tests/bench/bench_vs_trl.py --models tiny --threads 1 --repeats 3 --steps 10
    python tests/bench/bench_vs_trl.py --models smollm2 --threads 1 --length 48 --micro-batch 16 \
        --lr 5e-6 --steps 4 --repeats 2 [--vllm]

runs, for each model and thread count,

    grpo bench RECIPE model... train.torch_threads=T generation.num_generations=G \
        generation.max_completion_length=L train.prompts_per_step=B train.micro_batch_size=M \
        train.learning_rate=LR generation.backend=hf|vllm --vs-trl --steps N --repeats R

with RECIPE quickstart and the model's `model.tiny.*` shape (tiny, small), or smollm2_arithmetic;
the tiny models' reward is quickstart's `length` with the target --target (16, as before).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

MODELS = {
    "tiny": dict(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512),
    "small": dict(hidden_size=512, num_layers=8, num_heads=8, intermediate_size=1792),
    "smollm2": None,
}


def command(model: str, threads: int, a: argparse.Namespace) -> list[str]:
    shape = MODELS[model]
    recipe = "quickstart" if shape else "smollm2_arithmetic"
    settings = [f"model.tiny.{k}={v}" for k, v in (shape or {}).items()]
    if shape:
        settings.append(f'rewards=[{{name = "length", args = {{target = {a.target}}}}}]')
    settings += [f"train.torch_threads={threads}", f"generation.num_generations={a.g}",
                 f"generation.max_completion_length={a.length}", f"train.prompts_per_step={a.b}",
                 f"train.micro_batch_size={a.micro_batch}", f"train.learning_rate={a.lr}", f"train.seed={a.seed}",
                 f"generation.backend={'vllm' if a.vllm else 'hf'}", *a.grpo_override]
    return [sys.executable, "-m", "grpocli.cli.app", "bench", recipe, *settings, "--vs-trl",
            "--steps", str(a.steps), "--repeats", str(a.repeats)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["tiny", "small"])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--repeats", type=int, default=2, help="trials per framework (alternating)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--b", type=int, default=8)
    p.add_argument("--g", type=int, default=8)
    p.add_argument("--length", type=int, default=24)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4, help="learning rate (both)")
    p.add_argument("--target", type=int, default=16, help="tiny models: the length reward's target (characters)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grpo-override", action="append", default=[], help="extra recipe key=value")
    p.add_argument("--vllm", action="store_true", help="grpo with generation.backend=vllm (colocated)")
    a = p.parse_args()
    for model in a.models:
        for threads in a.threads:
            cmd = command(model, threads, a)
            print("$ " + " ".join(cmd[1:]), flush=True)
            subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
