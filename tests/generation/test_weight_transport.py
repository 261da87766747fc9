"""Which weight transport the vllm-server backend picks (grpocli.generation.vllm_client.choose_transport).

NCCL refuses two ranks on one GPU, so a trainer on the GPU the server reports (/info "device",
by UUID) must end in http, or in a UserError where nccl was asked for: never an NCCL hang.
The real thing, a `grpo vllm-serve` on the trainer's GPU, is in tests/engines/test_vllm_gpu.py.
"""

from __future__ import annotations

import pytest

from grpocli.errors import UserError
from grpocli.generation.vllm_client import choose_transport

GPU0 = {"type": "cuda", "index": 0, "uuid": "GPU-aaaa", "name": "NVIDIA H100"}
GPU1 = {"type": "cuda", "index": 0, "uuid": "GPU-bbbb", "name": "NVIDIA H100"}  # index 0 in its own process
CPU = {"type": "cpu"}
GPU_SERVER = ["http", "gloo", "nccl"]


def info(device=None, transports=GPU_SERVER, **more):
    out = {"transports": transports, **more}
    if device is not None:
        out["device"] = device
    return out


def test_a_cpu_trainer_sends_over_http():
    assert choose_transport(None, CPU, info(GPU1)) == "http"


def test_a_gpu_trainer_and_a_server_on_another_gpu_use_nccl():
    assert choose_transport(None, GPU0, info(GPU1)) == "nccl"


def test_a_server_on_the_trainers_own_gpu_gets_http():
    assert choose_transport(None, GPU0, info(dict(GPU0, index=3))) == "http"


def test_a_server_that_does_not_say_its_gpu_gets_http():
    assert choose_transport(None, GPU0, info()) == "http"
    assert choose_transport(None, GPU0, info(dict(GPU1, uuid=None))) == "http"


def test_a_cpu_server_gets_http():
    assert choose_transport(None, GPU0, info(CPU, transports=["http", "gloo"])) == "http"


def test_a_fleet_with_one_server_on_the_trainers_gpu_gets_http():
    assert choose_transport(None, GPU0, info(GPU1, devices=[GPU1, GPU0])) == "http"
    assert choose_transport(None, GPU0, info(GPU1, devices=[GPU1, dict(GPU1, uuid="GPU-cccc")])) == "nccl"


def test_nccl_asked_for_on_the_trainers_gpu_is_a_user_error():
    with pytest.raises(UserError) as err:
        choose_transport("nccl", GPU0, info(GPU0))
    text = str(err.value)
    assert text.startswith("GRPO_VLLM_WEIGHT_TRANSPORT:") and "own GPU" in text and "GPU-aaaa" in text
    assert "http" in text and "CUDA_VISIBLE_DEVICES" in text and err.value.exit_code == 2


def test_what_is_asked_for_is_taken_where_it_can_work():
    assert choose_transport("nccl", GPU0, info(GPU1)) == "nccl"
    assert choose_transport("http", GPU0, info(GPU0)) == "http"
    assert choose_transport("gloo", GPU0, info(GPU0)) == "gloo"  # CPU tensors: no GPU rank


def test_a_transport_the_server_does_not_offer_is_a_user_error():
    with pytest.raises(UserError, match="offers no 'nccl' weight transport"):
        choose_transport("nccl", GPU0, info(CPU, transports=["http", "gloo"]))


def test_a_process_that_sends_nothing_only_checks_what_the_servers_offer():
    """Processes other than the main one send no weights: a server on their GPU is no matter."""
    assert choose_transport("nccl", None, info(GPU0)) == "nccl"
    assert choose_transport(None, None, info(GPU1)) == "http"
    with pytest.raises(UserError, match="offers no 'nccl'"):
        choose_transport("nccl", None, info(CPU, transports=["http", "gloo"]))
