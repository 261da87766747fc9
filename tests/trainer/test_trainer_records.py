"""What a step leaves on disk: every metrics.jsonl line has every time/* key (skipped updates
too) and TRL's keys (none of kl, entropy, clip_ratio where no row was computed, which `grpo inspect` says), the parts of time/training are named under it and counted once by `grpo inspect`, and
rollouts carry the prompt's dataset columns (the gold answer), shown by `grpo inspect --rollouts`."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console
from tiny_runs import FAST

from grpocli.inspection.overview import show_run, timed_seconds
from grpocli.recipe import load_recipe
from grpocli.trainer.loop import train

TIME_KEYS = {"time/generation", "time/rewards", "time/logprobs", "time/training", "time/weight_sync",
             "time/training/forward_backward", "time/training/optimizer"}
PHASES = ("time/generation", "time/rewards", "time/logprobs", "time/training", "time/weight_sync")


def run(tmp_path, *overrides: str) -> list[dict]:
    out = tmp_path / "run"
    train(load_recipe("quickstart", [*FAST, f"train.output_dir={out}", *overrides]))
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_time_keys_parts_and_rollout_columns(tmp_path):
    metrics = run(tmp_path)
    for m in metrics:
        assert TIME_KEYS <= set(m), TIME_KEYS - set(m)
        assert {k for k in m if k.startswith("time/")} == TIME_KEYS
        parts = m["time/training/forward_backward"] + m["time/training/optimizer"]
        assert 0 < parts <= m["time/training"]
    trl = {"clip_ratio/low_min", "clip_ratio/high_max", "completions/min_terminated_length",
           "completions/max_terminated_length", "step_time", "kl", "entropy"}  # TRL's names
    for m in metrics:
        assert trl <= set(m), trl - set(m)
        assert m["step_time"] == pytest.approx(sum(m[k] for k in PHASES))
        assert 0 <= m["clip_ratio/low_min"] <= m["clip_ratio/low_mean"] + 1e-9
        assert m["clip_ratio/high_max"] >= m["clip_ratio/high_mean"] - 1e-9
        if m["completions/clipped_ratio"] < 1:
            assert (m["completions/min_terminated_length"] <= m["completions/mean_terminated_length"]
                    <= m["completions/max_terminated_length"] <= m["completions/max_length"])
    # inspect's total counts each second once: the phases, not their parts
    assert timed_seconds(metrics) == pytest.approx(sum(m[k] for m in metrics for k in PHASES))
    rows = [json.loads(line) for line in (tmp_path / "run/rollouts/step-1.jsonl").read_text().splitlines()]
    assert all(set(r["columns"]) == {"answer"} for r in rows)
    assert all(r["columns"]["answer"] == eval(r["prompt"].split("user\n")[1].split("=")[0]) for r in rows)
    out = io.StringIO()
    show_run(str(tmp_path / "run"), rollouts_step=1, n=2, console=Console(file=out, width=220))
    text = out.getvalue()
    assert "columns" in text and any(f"answer: {r['columns']['answer']}" in text for r in rows)


def test_skipped_updates_still_log_every_time_key(tmp_path):
    """A reward of weight 0 gives every group the same total: no group enters the loss, every
    update is skipped, and the lines still hold every time/* key (its parts 0)."""
    metrics = run(tmp_path, 'rewards=[{name="length", weight=0.0}]')
    assert [m["skipped_update"] for m in metrics] == [1.0, 1.0]
    for m in metrics:
        assert {k for k in m if k.startswith("time/")} == TIME_KEYS
        assert m["time/training/forward_backward"] == 0.0 and m["time/training/optimizer"] == 0.0
        # no row computed: no kl, entropy or clip figure (a 0 would read as a collapse)
        assert not {"kl", "entropy", "clip_ratio/low_mean", "clip_ratio/high_max"} & set(m)
    out = io.StringIO()
    show_run(str(tmp_path / "run"), console=Console(file=out, width=400))
    assert "steps 1, 2 computed no rows" in out.getvalue() and "no kl, entropy" in out.getvalue()
