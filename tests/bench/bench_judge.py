"""Benchmark: the judge reward against a real `grpo vllm-serve` (not part of the test run).

    python tests/bench/bench_judge.py                          # tiny model, 64 completions
    python tests/bench/bench_judge.py --model DIR --completions 64 --concurrency 1 8 --max-tokens 16

Starts `grpo vllm-serve` on MODEL (default: the tiny model the tests build), then for each
concurrency judges COMPLETIONS distinct completions on a fresh reply cache (seconds, judged/s, how
many replies were read), and once more with the same batch (every reply from the cache). The
1-minute load average is printed: on a shared machine, compare figures taken under similar load.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]


def tiny_model(directory: Path) -> Path:
    from grpocli.models import build_char_tokenizer, build_tiny_model, save_model
    from grpocli.recipe.schema import TinyModel

    tokenizer = build_char_tokenizer()
    shape = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 128}
    save_model(build_tiny_model(TinyModel(**shape), tokenizer, 0), tokenizer, directory)
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a checkpoint directory (default: the tests' tiny model)")
    parser.add_argument("--completions", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-tokens", type=int, default=16)
    opts = parser.parse_args()

    from vllm_serve_process import Server

    from grpocli.rewards import judge as judge_module
    from grpocli.rewards.scoring import RewardLog

    work = Path(tempfile.mkdtemp(prefix="bench-judge-"))
    model = Path(opts.model) if opts.model else tiny_model(work / "tiny")
    server = Server(model, work / "server.log", api_key=None, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    try:
        server.wait()
        n = opts.completions
        prompts = [f"What is {i} + {i}?" for i in range(n)]
        completions = [f"It is {2 * i}." for i in range(n)]
        print(f"model {model}, {n} completions, max_tokens {opts.max_tokens}, load {os.getloadavg()[0]:.1f}")
        for concurrency in opts.concurrency:
            judge_module._judges.clear()  # a fresh reply cache
            args = {"base_url": server.url + "/v1", "model": str(model), "max_tokens": opts.max_tokens,
                    "concurrency": concurrency, "temperature": 0.0}
            for label in ("sent", "cached"):
                log = RewardLog()
                t0 = time.perf_counter()
                scores = judge_module.judge(prompts, completions, log_metric=log.log_metric, **args)
                dt = time.perf_counter() - t0
                read = sum(s is not None for s in scores)
                print(f"concurrency {concurrency:3d} {label:6s}: {dt:7.3f} s, {n / dt:8.1f} judged/s, "
                      f"requests {log.metrics['judge/requests'][0]:.0f}, read {read}/{n}")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
        print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
