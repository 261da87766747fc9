"""Benchmark: loading a GGUF model from the file, converting it once, and from its dense copy (model.gguf_cache;
not part of the test run).

    taskset -c 0 python tests/bench/bench_gguf_load.py                  # smollm2_arithmetic's SmolLM2-135M
    python tests/bench/bench_gguf_load.py --recipe RECIPE --rounds 2

Each trial is a fresh process (OMP_NUM_THREADS=1) with its own empty $GRPO_CACHE_DIR per round: it imports
transformers and gguf first (not counted), then times grpo's load_tokenizer and load_policy of the recipe's
model: with model.gguf_cache=false (the file, every time), then twice with the cache on (the first load
converts and writes the copy, the second reads it). Prints seconds per phase and the copy's size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

TRIAL = """
import json, sys, time
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: F401
import gguf  # noqa: F401
from grpocli.models import load_policy, load_tokenizer
from grpocli.recipe import load_recipe
model = load_recipe(sys.argv[1], [f"model.gguf_cache={sys.argv[2]}"]).recipe.model
start = time.perf_counter(); load_tokenizer(model); tokenizer = time.perf_counter() - start
start = time.perf_counter(); load_policy(model, seed=0); policy = time.perf_counter() - start
print(json.dumps({"tokenizer": tokenizer, "policy": policy}))
"""


def trial(recipe: str, cache: str, cache_dir: Path) -> dict:
    env = {**os.environ, "GRPO_CACHE_DIR": str(cache_dir), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", TRIAL, recipe, cache], capture_output=True, text=True, env=env,
                          cwd=ROOT, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="smollm2_arithmetic")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    print("| load | tokenizer s | policy s | both s |\n|---|---|---|---|")
    for _ in range(args.rounds):
        cache_dir = Path(tempfile.mkdtemp(prefix="grpo-bench-cache-"))
        try:
            for name, cache in [("from the file (model.gguf_cache=false)", "false"),
                                ("first load: converts, writes the copy", "true"), ("later loads: the copy", "true")]:
                t = trial(args.recipe, cache, cache_dir)
                print(f"| {name} | {t['tokenizer']:.1f} | {t['policy']:.1f} | {t['tokenizer'] + t['policy']:.1f} |",
                      flush=True)
            sizes = [sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) for d in (cache_dir / "gguf").iterdir()]
            print(f"copy: {', '.join(f'{s / 1e6:.0f} MB' for s in sizes)}")
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
