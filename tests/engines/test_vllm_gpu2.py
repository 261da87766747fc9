"""vLLM on two CUDA GPUs: colocated engines of two training processes each on their own GPU (the
external launcher), and weights over NCCL to a `grpo vllm-serve` on the other GPU. Skipped with
fewer than two GPUs; each under 2 minutes on H100s, offline, on the tiny model from a config.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm.entrypoints.llm", reason="vLLM is not installed: pip install 'grpocli[vllm]'")
pytestmark = [pytest.mark.vllm, pytest.mark.gpu2]

from gpu_helpers import gap, server_backend, started_server, tiny_model

from grpocli.generation.base import Sampling

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("gpu2_colocate_worker.py")


def second_gpu() -> str:
    """CUDA_VISIBLE_DEVICES for a process on the second GPU this process sees."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[1].strip() if visible else "1"


def test_each_colocated_engine_sits_on_its_own_processes_gpu(tmp_path):
    """Two processes (torchrun, accelerate): engine weights and KV cache on cuda:rank, nothing of a
    process on the other GPU, each process still on its own device after the engine started, and a
    sync plus a generation on the prefetch thread."""
    from vllm_serve_process import free_port

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PYTHONUNBUFFERED": "1"}
    env.pop("MASTER_PORT", None)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-port", str(free_port()), str(WORKER), str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=115, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    for r in reports:
        rank = r["rank"]
        assert r["backend"] == "external_launcher"
        assert r["device"] == r["engine_device"] == f"cuda:{rank}"
        assert r["current_after_start"] == r["current_at_end"] == rank
        assert r["engine_uuid"] == r["own_uuid"]
        assert r["allocated"][rank] > 0
        assert all(used == 0 for i, used in enumerate(r["allocated"]) if i != rank), r["allocated"]
        assert r["completions"] == 2
    assert reports[0]["engine_uuid"] != reports[1]["engine_uuid"]


def test_weights_go_over_nccl_to_a_server_on_the_other_gpu(tiny_dir, tiny_shape, tmp_path, monkeypatch,
                                                          reference_logprobs):
    """A server with a GPU takes weights over NCCL (vLLM's own engine); the first sync and a later one
    reach the float32 server, whose log-probs then follow each policy."""
    monkeypatch.delenv("GRPO_VLLM_WEIGHT_TRANSPORT", raising=False)
    sample = Sampling(max_tokens=8, temperature=1.0)
    prompts = [[26, 27, 20, 32, 38], [1, 94, 92, 78, 91, 8]]
    with started_server(tiny_dir, tmp_path / "server.log", env={"CUDA_VISIBLE_DEVICES": second_gpu()}) as url:
        model, tokenizer = tiny_model(tiny_shape, seed=6)
        backend = server_backend(url, model, tokenizer)
        try:
            assert backend.transport == "nccl"
            assert gap(model, backend.generate_ids(prompts, 2, sample), 2, reference_logprobs) < 1e-2
            other, _ = tiny_model(tiny_shape, seed=7)
            backend.sync_weights(other)
            assert gap(other, backend.generate_ids(prompts, 2, sample), 2, reference_logprobs) < 1e-2
        finally:
            backend.close()
