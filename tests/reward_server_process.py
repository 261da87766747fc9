"""A real `grpo reward-serve` subprocess on 127.0.0.1 for tests (a module, like vllm_serve_process.py).

It is started with ``--port 0`` (the server binds a free port before loading anything) and its
URL is read from the line it prints once it answers: no port race, no polling.
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVING = re.compile(r"serving (http://\S+) ")


class RewardServer:
    """`grpo reward-serve REWARDS... --port 0` in ``cwd``; ``url`` once it serves; ``output`` its lines."""

    def __init__(self, *rewards: str, cwd: Path, api_key: str | None = None, env: dict | None = None,
                 args: tuple[str, ...] = (), timeout: float = 120.0) -> None:
        cmd = [sys.executable, "-m", "grpocli.cli.app", "reward-serve", *rewards, "--port", "0",
               *(["--api-key", api_key] if api_key else []), *args]
        pythonpath = os.pathsep.join(p for p in (str(ROOT), str(cwd), os.environ.get("PYTHONPATH", "")) if p)
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": pythonpath, **(env or {})}
        full_env.pop("GRPO_REWARD_API_KEY", None)
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.output: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.url = self._wait(timeout)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def _wait(self, timeout: float) -> str:
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                self.stop()
                raise RuntimeError(f"grpo reward-serve printed no URL within {timeout} s:\n{''.join(self.output)}")
            if line is None:
                self.proc.wait()
                raise RuntimeError(f"grpo reward-serve exited ({self.proc.returncode}):\n{''.join(self.output)}")
            found = SERVING.search(line)
            if found:
                return found.group(1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
