"""Shared by the fault tests: one finished tiny run, trained once, copied for each test that harms it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from tiny_runs import FAST

from grpocli.recipe import load_recipe
from grpocli.rundir import RunDir
from grpocli.trainer.loop import train

#: 4 steps, checkpoints step-2 and step-4, rollouts of every step.
RUN = [*FAST, "train.steps=4", "train.save_steps=2"]


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> Path:
    """A finished 4-step run with checkpoints step-2 and step-4 (trained once per test session)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tmp_path_factory.mktemp("trained") / "run"
        train(load_recipe("quickstart", [*RUN, f"train.output_dir={out}"]))
    finally:
        torch.set_num_threads(before)
    assert [s for s, _ in RunDir(out).list_checkpoints()] == [2, 4]
    return out


@pytest.fixture
def run_copy(trained, tmp_path) -> Path:
    """A copy of the finished run that a test may damage."""
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy
