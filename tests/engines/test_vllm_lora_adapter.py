"""vllm.lora_sync = "adapter": a LoRA policy's sync sends its adapters alone and vLLM applies them: the colocated
engine (a new LoRARequest version each sync, the base weights held once) and a `grpo vllm-serve --lora-rank R`
(a new /v1/load_lora_adapter version each sync); the merged sync stays for what vLLM's LoRA cannot serve, said
in one line."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'grpocli[vllm]')")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

from cli_runner import run_grpo  # noqa: E402
from vllm_serve_process import TINY, tiny_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny-model"))


def _run(tiny_dir, out, *more):
    done = run_grpo("train", "quickstart", "generation.backend=vllm", f"model.name_or_path='{tiny_dir}'",
                    "model.lora.enabled=true", "model.lora.r=8", "train.learning_rate=0.01", "train.steps=3",
                    "train.torch_threads=1", "train.prompts_per_step=4", "generation.num_generations=4",
                    "log.progress=none", "log.rollouts_every=0", "train.save_steps=0", f"train.output_dir='{out}'",
                    *more, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done, [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_adapter_sync_sends_the_adapters_alone_and_the_engine_samples_the_trained_policy(tiny_dir, tmp_path):
    done, adapter = _run(tiny_dir, tmp_path / "adapter", "vllm.lora_sync=adapter")  # "auto" is merged on a CPU
    assert "falls back" not in done.stderr
    assert all(r["grad_norm"] > 0 for r in adapter)  # the adapters moved between syncs
    for r in adapter:  # the engine's log-probs are the LoRA policy's, step after step
        assert r["sampling/sampling_logp_difference/max"] < 1e-4, r
    # 2 layers x 7 adapted projections x (A, B): no base weight travels
    assert {r["weight_sync/tensors"] for r in adapter} == {28.0}
    whole = (tiny_dir / "model.safetensors").stat().st_size  # what a merged sync sends (float32, as saved)
    assert 0 < adapter[-1]["weight_sync/bytes"] < whole / 4, (adapter[-1]["weight_sync/bytes"], whole)


def test_adapter_sync_to_a_vllm_server_loads_each_version_and_sends_no_base_weight(tiny_dir, tmp_path):
    """The server reads each version's adapter files (this machine's disk) and later requests name it; the
    engine's log-probs are the LoRA policy's at every step; no /update_weights (no base weight) at all."""
    from vllm_serve_process import Server

    server = Server(tiny_dir, tmp_path / "server.log", api_key=None, args=("--lora-rank", "8", "--log-level", "info"))
    try:
        server.wait(timeout=300)
        done, rows = _run(tiny_dir, tmp_path / "run", "generation.backend=vllm-server",
                          f"vllm.server_url='{server.url}'", "vllm.lora_sync=adapter")
        log = server.tail(10**7)
    finally:
        server.stop()
    assert "falls back" not in done.stderr
    for r in rows:
        assert r["sampling/sampling_logp_difference/max"] < 1e-4, r
    assert {r["weight_sync/tensors"] for r in rows} == {28.0}
    assert log.count('"POST /v1/load_lora_adapter HTTP/1.1" 200') >= 3, log[-3000:]
    assert "/update_weights" not in log and "/init_weight_transfer_engine" not in log


def test_what_vllms_lora_cannot_serve_falls_back_to_merged_weights_saying_why():
    from peft import LoraConfig, get_peft_model

    from grpocli.generation.lora_adapter import adapter_problem
    from grpocli.models import build_char_tokenizer, build_tiny_model
    from grpocli.recipe.schema import TinyModel

    def peft(**config):
        base = build_tiny_model(TinyModel(**TINY), build_char_tokenizer(), 0)
        return get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], **config))

    assert adapter_problem(peft()) is None
    assert "DoRA" in adapter_problem(peft(use_dora=True))
    assert "modules_to_save" in adapter_problem(peft(modules_to_save=["lm_head"]))
    assert "inflight" in adapter_problem(peft(), inflight=True)
    assert "more than one training process" in adapter_problem(peft(), processes=2)
    assert "sharded" in adapter_problem(peft(), sharded=True)
