"""Devices of processes and threads, and GPU identity (grpocli.generation.devices), on a CPU.

``torch.cuda.set_device`` is replaced by a recorder: what matters here is which thread asks for
which device; the real placement is checked by the gpu tests in tests/engines/test_vllm_gpu*.py.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from grpocli.generation import devices
from grpocli.generation.devices import cuda_device, process_device, use_device


@pytest.fixture
def set_device(monkeypatch):
    """Records (thread name, device) of every torch.cuda.set_device call."""
    calls: list[tuple[str, torch.device]] = []
    monkeypatch.setattr(devices.torch.cuda, "set_device",
                        lambda d: calls.append((threading.current_thread().name, torch.device(d))))
    return calls


def test_cuda_device_is_none_for_the_cpu_and_keeps_an_index():
    assert cuda_device(None) is None and cuda_device("cpu") is None and cuda_device(torch.device("cpu")) is None
    assert cuda_device("cuda:3") == torch.device("cuda", 3)


def test_process_device_takes_the_first_gpu_among_its_candidates():
    assert process_device(torch.device("cpu"), "cuda:1", "cuda:0") == torch.device("cuda", 1)
    if not torch.cuda.is_available():
        assert process_device(torch.device("cpu"), None) is None


def test_use_device_sets_an_indexed_cuda_device_only(set_device):
    use_device(None)
    use_device("cpu")
    use_device(torch.device("cuda", 2))
    assert set_device == [(threading.current_thread().name, torch.device("cuda", 2))]


def test_the_prefetch_thread_takes_the_process_device_first(set_device):
    """generation.async_steps: the backend is called on a worker thread, which starts on GPU 0
    unless it sets the process's device (here cuda:1) first."""
    from grpocli.generation.base import Generated, Sampling
    from grpocli.trainer.prefetch import Prefetcher

    seen = []

    class Backend:
        parallel = SimpleNamespace(device=torch.device("cuda", 1))

        def generate(self, prompts, n, sampling):
            seen.append(threading.current_thread().name)
            return Generated(prompt_ids=[[1]], completion_ids=[[2]] * n, truncated=[False] * n, logprobs=None)

    pf = Prefetcher(Backend(), ahead=1, n=2, sampling=Sampling(max_tokens=2))
    try:
        rows = [{"prompt_text": "a"}]
        pf.next(lambda: rows, step=0)
        pf.drain()
    finally:
        pf.close()
    assert seen and all(name.startswith("grpo-generate") for name in seen)
    assert set_device and all(name.startswith("grpo-generate") and d == torch.device("cuda", 1)
                              for name, d in set_device)


def test_the_prefetch_thread_on_a_cpu_run_sets_nothing(set_device):
    from grpocli.generation.base import Generated, Sampling
    from grpocli.parallel import Parallel
    from grpocli.trainer.prefetch import Prefetcher

    class Backend:
        parallel = Parallel.alone()

        def generate(self, prompts, n, sampling):
            return Generated(prompt_ids=[[1]], completion_ids=[[2]] * n, truncated=[False] * n, logprobs=None)

    pf = Prefetcher(Backend(), ahead=0, n=1, sampling=Sampling(max_tokens=2))
    try:
        pf.next(lambda: [{"prompt_text": "a"}], step=0)
    finally:
        pf.close()
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        assert set_device == []


def test_the_server_engine_thread_takes_the_engine_device_first(set_device):
    from grpocli.reference.worker import Job, Worker

    def run_all(jobs):
        for job in jobs:
            worker.run(job, lambda: threading.current_thread().name, label=job.kind, limit=None)

    worker = Worker("grpo-engine", run_all, subject="the engine", worker="the engine worker",
                    restart="grpo ref-serve", device=torch.device("cuda", 3))
    try:
        assert worker.ask(Job("ping"), timeout=10) == "grpo-engine"
    finally:
        worker.close()
    assert set_device == [("grpo-engine", torch.device("cuda", 3))]


def test_fleet_sender_threads_take_the_calling_threads_device(monkeypatch, set_device):
    """Several servers: each call runs on its own thread, on the caller's GPU (NCCL buckets live there)."""
    from grpocli.generation import fleet as fleet_module
    from grpocli.generation.fleet import ServerFleet

    monkeypatch.setattr(fleet_module, "current_cuda_device", lambda: torch.device("cuda", 5))
    class Client:
        def __init__(self, url: str) -> None:
            self.url = url

    a, b = Client("http://a"), Client("http://b")
    results, failed = ServerFleet([a, b]).gather({a: lambda: threading.current_thread().name,
                                                   b: lambda: threading.current_thread().name})
    assert not failed and all(name.startswith("grpo-fleet") for name in results.values())
    assert sorted(name for name, _ in set_device) == sorted(results.values())
    assert {d for _, d in set_device} == {torch.device("cuda", 5)}
