"""Shared test setup: offline, quiet, and the repository root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def run_grpo(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the real `grpo` command line in a subprocess."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "grpocli.cli.app", *args],
        capture_output=True, text=True, env=full_env, cwd=cwd or ROOT, timeout=timeout,
    )


@pytest.fixture
def grpo():
    return run_grpo
