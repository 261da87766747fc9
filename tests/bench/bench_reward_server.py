"""Benchmark: what scoring through `grpo reward-serve` adds per batch (not part of the test run).

    python tests/bench/bench_reward_server.py                      # 64 completions, 50 batches
    python tests/bench/bench_reward_server.py --rows 16 256 --batches 100

The built-in `length` reward (microseconds of work) scores the same batch of chat completions
(prompts, message-list completions, completion_ids of 32 tokens, two dataset columns) in-process,
through one server, and through two servers (each takes half); a batch is one `grpocli.rewards.score`
call. The servers are real `grpo reward-serve` subprocesses on 127.0.0.1. Reported: the median
milliseconds per batch after 5 warm-up batches, and the 1-minute load average (on a shared
machine compare only figures taken under similar load).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def batch(rows: int) -> dict:
    prompts = [[{"role": "user", "content": f"What is {i} + {i}? Answer with a number."}] for i in range(rows)]
    return {"prompts": prompts, "completions": [f"The answer is {2 * i}, I think." for i in range(rows)],
            "columns": {"answer": [str(2 * i) for i in range(rows)], "level": [i % 3 for i in range(rows)]},
            "completion_ids": [list(range(32)) for _ in range(rows)]}


def per_batch_ms(fns, data: dict, batches: int) -> float:
    from grpocli.rewards import score

    times = []
    for k in range(batches + 5):
        t0 = time.perf_counter()
        score(fns, data["prompts"], data["completions"], data["columns"], completion_ids=data["completion_ids"])
        if k >= 5:
            times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[64])
    parser.add_argument("--batches", type=int, default=50)
    opts = parser.parse_args()

    from reward_server_process import RewardServer

    from grpocli.recipe.schema import RewardSpec
    from grpocli.registry import load_plugins
    from grpocli.rewards import resolve

    registry = load_plugins().rewards
    with tempfile.TemporaryDirectory() as folder:
        servers = [RewardServer("length", cwd=Path(folder)) for _ in range(2)]
        try:
            setups = {"in-process": RewardSpec(name="length"),
                      "1 server": RewardSpec(name="length", url=servers[0].url),
                      "2 servers": RewardSpec(name="length", url=[s.url for s in servers])}
            print(f"load average before: {os.getloadavg()[0]:.1f}")
            for rows in opts.rows:
                for label, spec in setups.items():
                    ms = per_batch_ms(resolve([spec], registry), batch(rows), opts.batches)
                    print(f"{rows:5d} completions  {label:10s}  {ms:8.2f} ms per batch", flush=True)
            print(f"load average after: {os.getloadavg()[0]:.1f}")
        finally:
            for server in servers:
                server.stop()


if __name__ == "__main__":
    main()
