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

    prepare_vllm_environment(kv_cache_gb=1, in_process=True)
except ImportError:  # pragma: no cover - grpocli itself is importable in every test run
    pass

#: A tiny Qwen2 whose head size (64 / 2 = 32) vLLM's CPU attention kernels accept.


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


from vllm_serve_process import TINY, Server, tiny_checkpoint  # noqa: E402
from vllm_serve_process import free_port as _free_port  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny policy + tokenizer saved as a checkpoint (what `grpo vllm-serve --model` reads)."""
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny-model"))


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
    """(status, parsed JSON, None for an empty body) of one real HTTP request; errors are answers too."""
    import json
    import urllib.error
    import urllib.request

    headers = {}
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


@pytest.fixture(scope="session")
def http():
    return http_call
