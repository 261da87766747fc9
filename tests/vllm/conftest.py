"""vLLM tests: the environment vLLM reads at import, and helpers shared by the test modules.

Every module here starts with ``pytest.importorskip("vllm", ...)``, so without vLLM the whole
directory skips with one line of reason and the rest of the suite runs.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
try:
    from grpocli.generation.vllm_colocate import prepare_vllm_environment

    prepare_vllm_environment(kv_cache_gb=1.0, in_process=True)
except ImportError:  # pragma: no cover - grpocli itself is importable in every test run
    pass

#: A tiny Qwen2 whose head size (64 / 2 = 32) vLLM's CPU attention kernels accept.
TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 128}


def hf_greedy(model, prompt_ids: list[list[int]], max_tokens: int) -> list[list[int]]:
    """transformers' greedy completions, cut after the first stop token (as engines return them)."""
    import torch

    eos = model.generation_config.eos_token_id
    eos = list(eos) if isinstance(eos, (list, tuple)) else [eos]
    out = []
    with torch.no_grad():
        for ids in prompt_ids:
            seq = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 do_sample=False, max_new_tokens=max_tokens, eos_token_id=eos,
                                 pad_token_id=eos[0])[0, len(ids):].tolist()
            cut = next((i + 1 for i, t in enumerate(seq) if t in eos), len(seq))
            out.append(seq[:cut])
    return out


def hf_logprobs(model, prompt: list[int], completion: list[int], temperature: float = 1.0) -> list[float]:
    """log p(completion token | prefix) under transformers, at the sampling temperature."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]  # [Tc, V]
        logp = torch.log_softmax(logits.float() / temperature, dim=-1)
        return logp.gather(1, torch.tensor(completion)[:, None])[:, 0].tolist()


@pytest.fixture(scope="session")
def tiny_shape() -> dict:
    return dict(TINY)


@pytest.fixture(scope="session")
def greedy_reference():
    return hf_greedy


@pytest.fixture(scope="session")
def reference_logprobs():
    return hf_logprobs


API_KEY = "test-key-123"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A real `grpo vllm-serve` subprocess on 127.0.0.1 (a free port), started with an API key
    (``api_key=None``: without one, as TRL's client needs: it sends none)."""

    def __init__(self, model_dir, log_path, api_key: str | None = API_KEY, env: dict | None = None) -> None:
        import subprocess
        import sys

        self.model_dir, self.port, self.key = str(model_dir), _free_port(), api_key
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.log = open(log_path, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "grpocli.cli.app", "vllm-serve", "--model", self.model_dir,
             "--port", str(self.port), "--dtype", "float32", "--max-model-len", "256",
             *(["--api-key", self.key] if self.key else [])],
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


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny policy + tokenizer saved as a checkpoint (what `grpo vllm-serve --model` reads)."""
    from grpocli.models import build_char_tokenizer, build_tiny_model, save_model
    from grpocli.recipe.schema import TinyModel

    directory = tmp_path_factory.mktemp("tiny-model")
    tokenizer = build_char_tokenizer()
    save_model(build_tiny_model(TinyModel(**TINY), tokenizer, 0), tokenizer, directory)
    return directory


@pytest.fixture(scope="session")
def vllm_server(tiny_dir, tmp_path_factory):
    """One server for every test that needs one (starting it takes ~20 s)."""
    server = Server(tiny_dir, tmp_path_factory.mktemp("server") / "server.log")
    try:
        server.wait()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server_factory(tiny_dir, tmp_path_factory):
    """start(api_key=None, env=None) -> another running Server on the tiny model; all stop with the module."""
    started = []

    def start(api_key: str | None = None, env: dict | None = None) -> Server:
        server = Server(tiny_dir, tmp_path_factory.mktemp("server") / "server.log", api_key=api_key, env=env)
        started.append(server)
        server.wait()
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="module")
def keyless_server(server_factory):
    """A server without an API key, for TRL's VLLMClient (it sends none); one per module that asks."""
    return server_factory(api_key=None)


@pytest.fixture
def free_port():
    return _free_port


def http_call(method: str, url: str, body=None, *, key: str | None = None, data: bytes | None = None,
              timeout: float = 60.0):
    """(status, parsed JSON) of one real HTTP request; errors are answers too."""
    import json
    import urllib.error
    import urllib.request

    headers = {}
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    if key:
        headers["X-API-Key"] = key
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


@pytest.fixture(scope="session")
def http():
    return http_call
