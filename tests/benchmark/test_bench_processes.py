"""`grpo bench RECIPE train.num_processes=2`: the two processes `grpo train` would start, each measuring,
here split by sequence parallelism (Ulysses over gloo); one JSON line from rank 0's figures; --vs-trl
stays one process."""

from __future__ import annotations

import json

TINY = ("model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=64", "generation.num_generations=2", "train.prompts_per_step=2",
        "train.micro_batch_size=1", "train.torch_threads=1")


def test_a_bench_on_two_processes_splitting_each_sequence_reports_them_and_their_tokens(grpo):
    done = grpo("bench", "quickstart", *TINY, "generation.max_completion_length=64", "train.num_processes=2",
                "train.sequence_parallel=2", "--forced-lengths", "--steps", "2", "--only-steps", "--json",
                timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout  # the workers' output went to stderr: stdout is rank 0's figures only
    f = json.loads(lines[0])
    assert (f["processes"], f["sequence_parallel"]) == (2, 2)
    assert f["steps_run"] == 2 and f["mean_completion_length"] == 64  # forced: every completion 64 tokens
    assert f["tokens_per_s"]["training"] > 0 and f["completion_tokens_per_s"] > 0
    # over both processes: each trains its own prompt's group (1 prompt x 2 completions of 64 tokens)
    assert f["tokens_per_s"]["training"] > f["tokens_per_s_per_process"]["training"] > 0
    assert len(f["peak_memory_by_process"]) == 2 and f["peak_memory_bytes"] == max(f["peak_memory_by_process"]) > 0
    assert "completions forced to max_completion_length (--forced-lengths)" in f["notes"]


def test_vs_trl_on_several_processes_is_a_clear_error(grpo):
    done = grpo("bench", "quickstart", "train.num_processes=2", "--vs-trl")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--vs-trl" in done.stderr and "train.num_processes=1" in done.stderr
