"""Benchmark: the cost of one `code.tests` case, per test format and isolation level (not part of the test run).

    python tests/bench/bench_code_sandbox.py                      # 24 cases a format, workers 1 and 2
    python tests/bench/bench_code_sandbox.py --cases 32 --levels bwrap --workers 2

Each format scores CASES copies of one correct completion (each case its own sandboxed process, the
interpreter's start included) and prints wall milliseconds per case and CPU milliseconds per case
(this process and the sandboxes), with the 1-minute load average: on a shared machine the wall
figures move with the load, the CPU figures much less; compare runs taken side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path[:0] = [str(ROOT)]

ADD = "```python\ndef add(a, b):\n    return a + b\n```"
SUMS = "```python\nprint(sum(map(int, input().split())))\n```"
FORMATS = {  # name: (completion, one case's tests)
    "assert": (ADD, ["assert add(1, 2) == 3"]),
    "call": (ADD, json.dumps({"inputs": [[1, 2]], "outputs": [3], "fn_name": "add"})),
    "stdio": (SUMS, {"inputs": ["1 2\n"], "outputs": ["3\n"]}),
    "script": (ADD, ["def check(candidate):\n    for i in range(3):\n        assert candidate(i, 1) == i + 1\ncheck(add)"]),
}


def _cpu_s() -> float:
    """User + system seconds of this process and of its children (the sandboxes, bwrap's included)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=24)
    parser.add_argument("--levels", nargs="+", default=["process", "bwrap"])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--formats", nargs="+", default=list(FORMATS))
    args = parser.parse_args()
    from grpocli.rewards.code_tests import code_tests

    print(f"uid {os.getuid()}, load average {os.getloadavg()[0]:.1f}")
    for level in args.levels:
        for workers in args.workers:
            for name in args.formats:
                completion, tests = FORMATS[name]
                code_tests([""], [completion], tests=[tests], isolation=level)  # the probe, once
                started, cpu = time.perf_counter(), _cpu_s()
                scores = code_tests([""] * args.cases, [completion] * args.cases, tests=[tests] * args.cases,
                                    isolation=level, workers=workers)
                took = (time.perf_counter() - started) / args.cases * 1000
                cpu = (_cpu_s() - cpu) / args.cases * 1000
                assert scores == [1.0] * args.cases, (name, level, scores)
                print(f"{level:8} workers={workers} {name:7} {took:6.0f} ms per case, {cpu:4.0f} ms CPU", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
