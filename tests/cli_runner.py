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
