"""What `grpo vllm-serve` says about its device in /info (grpocli.server.host.EngineHost.info), and
that its engine thread takes the engine's GPU: a stand-in engine, no vLLM, no HTTP."""

from __future__ import annotations

import threading

import torch

from grpocli.generation import devices
from grpocli.server.host import EngineHost


class Engine:
    model, max_model_len, world_size, dtype, spec = "/tiny", 64, 1, torch.float32, {}

    def __init__(self, device=None) -> None:
        self.device = device

    def close(self) -> None:
        pass


def test_a_cpu_engine_says_cpu():
    host = EngineHost(Engine())
    try:
        info = host.info()
    finally:
        host.close()
    assert info["device"] == {"type": "cpu"}
    assert info["transports"][:2] == ["http", "gloo"]


def test_a_gpu_engine_gives_its_uuid_and_its_thread_takes_its_gpu(monkeypatch):
    calls = []
    monkeypatch.setattr(devices.torch.cuda, "set_device", lambda d: calls.append((threading.current_thread().name,
                                                                                  torch.device(d))))
    monkeypatch.setattr(devices.torch.cuda, "get_device_properties",
                        lambda d: type("Props", (), {"uuid": "GPU-1234", "name": "NVIDIA H100"})())
    host = EngineHost(Engine(torch.device("cuda", 1)))
    try:
        info = host.info()
        assert host.run(lambda: threading.current_thread().name, timeout=10) == "grpo-engine"
    finally:
        host.close()
    assert info["device"] == {"type": "cuda", "index": 1, "uuid": "GPU-1234", "name": "NVIDIA H100"}
    assert ("grpo-engine", torch.device("cuda", 1)) in calls
