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


def grpo_in_process(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """The real command line, in this process (no interpreter to start): its exit code and output."""
    from grpocli.cli.app import main

    monkeypatch.setattr(sys, "argv", ["grpo", *args])
    try:
        main()
        code = 0
    except SystemExit as done:
        code = done.code or 0
    out = capsys.readouterr()
    return code, out.out + out.err


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


def assert_clean_error(out: subprocess.CompletedProcess, *needles: str) -> str:
    """A user error: exit 2, no traceback, every needle in stderr; returns stderr."""
    text = out.stdout + out.stderr
    assert out.returncode == 2, (out.returncode, text[-3000:])
    assert "Traceback" not in text, text[-3000:]
    for needle in needles:
        assert needle in out.stderr, f"{needle!r} not in:\n{out.stderr}"
    return out.stderr


def assert_user_error(out: subprocess.CompletedProcess, *needles: str) -> str:
    """As assert_clean_error, and the message is one `error:` line; returns stderr."""
    assert_clean_error(out, *needles)
    assert out.stderr.count("error: ") == 1, out.stderr
    return out.stderr


def unwritable_place(tmp_path: Path) -> Path:
    """A directory this process cannot create things in: a chmod 555 folder (not for root, whom
    permissions do not stop), else a read-only system folder; skip where there is none."""
    import pytest

    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        return locked
    try:
        os.mkdir("/sys/grpo-write-probe")
    except OSError:
        return Path("/sys")
    os.rmdir("/sys/grpo-write-probe")
    pytest.skip("running as root, where chmod does not stop writes, and /sys is writable here")


def sigkill_when(cmd: list[str], ready, *, env: dict[str, str] | None = None, within: float = 300.0,
                 settle: float = 0.0, what: str = "the moment to kill") -> None:
    """Start ``cmd``, wait until ``ready()`` (at most ``within`` seconds; the process must stay alive), wait
    ``settle`` seconds more, then SIGKILL it: a real crash, mid-run. Fails if the run ended before the kill."""
    import signal
    import time

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=env or {**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + within
        while not ready():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, f"no {what} within {within:g} s"
            time.sleep(0.02)
        time.sleep(settle)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
