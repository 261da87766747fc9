"""Crash safety: a `grpo train` killed with SIGKILL leaves no complete-looking partial checkpoint,
and running the same command again finishes the run with every step logged exactly once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from cli_runner import sigkill_when

from grpocli.rundir import RunDir

STEPS = 40
SETTINGS = [
    "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=64", "generation.max_completion_length=8",
    "generation.num_generations=4", "train.prompts_per_step=4", "log.progress=none",
    "log.rollouts_every=0", "data.args={num_samples=64}", f"train.steps={STEPS}", "train.save_steps=2",
]
#: What every complete checkpoint holds (save_pretrained model + tokenizer, trainer state).
CONTENTS = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "trainer/state.json", "trainer/optimizer.pt", "trainer/scheduler.pt", "trainer/rng-rank0.pt")


def _command(out) -> list[str]:
    return [sys.executable, "-m", "grpocli.cli.app", "train", "quickstart", *SETTINGS, f"train.output_dir={out}"]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _kill_after_first_checkpoint(out) -> None:
    """SIGKILL a few steps after the first checkpoint: the kill may land inside a later save."""
    run = RunDir(out)
    sigkill_when(_command(out), run.list_checkpoints, env=_env(), within=240, settle=0.15, what="checkpoint")


@pytest.mark.slow
def test_sigkill_then_rerun_completes_with_each_step_once(tmp_path):
    out = tmp_path / "run"
    run = RunDir(out)
    _kill_after_first_checkpoint(out)

    killed_at = max(m["step"] for m in run.read_metrics())
    assert killed_at < STEPS
    for entry in run.checkpoints.iterdir():  # step-N is complete; anything else is step-N.tmp
        if entry.name.endswith(".tmp"):
            continue
        missing = [f for f in CONTENTS if not (entry / f).exists()]
        assert not missing, f"{entry.name} looks complete but lacks {missing}"
    latest = run.latest_checkpoint()
    assert latest is not None and latest[1].name == f"step-{latest[0]}"

    result = subprocess.run(_command(out), env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [m["step"] for m in run.read_metrics()] == list(range(1, STEPS + 1))
    assert run.latest_checkpoint()[0] == STEPS
    assert not list(run.checkpoints.glob("*.tmp"))  # leftovers of the crash are cleaned up
