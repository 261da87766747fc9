"""Running the real `grpo` command line in a subprocess, for tests in any folder.

(A module of its own: `from conftest import ...` is ambiguous once sub-folders have conftest.py.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_grpo(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python -m grpocli.cli.app ARGS` and capture its output."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "grpocli.cli.app", *args],
        capture_output=True, text=True, env=full_env, cwd=cwd or ROOT, timeout=timeout,
    )


def install_plugin(source: Path, target: Path) -> Path:
    """``pip install --target`` of a plugin distribution (no deps, no index, no build isolation),
    so the test environment's own site-packages stay as they are; skips without pip or hatchling."""
    import importlib.util

    import pytest

    if importlib.util.find_spec("pip") is None:
        pytest.skip("pip is not installed in this environment")
    if importlib.util.find_spec("hatchling") is None:
        pytest.skip("hatchling (the plugin's build backend) is not installed: pip install hatchling")
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--no-build-isolation",
           "--disable-pip-version-check", "--quiet", "--target", str(target), str(source)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return target
