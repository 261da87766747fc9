"""FSDP2 (train.sharding = "fsdp2") on 2 CPU processes over gloo, against DDP (DeepSpeed: test_deepspeed.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import ROOT, run_grpo
from tiny_runs import FAST

from grpocli.rundir import RunDir

SETTINGS = [*FAST, "train.steps=3", "train.save_steps=2", "train.num_processes=2", "train.torch_threads=1",
            "algorithm.beta=0.04"]  # a KL term: the reference model is sharded too
COMPARED = ("loss", "reward", "reward_std", "grad_norm", "kl", "entropy", "completions/mean_length",
            "clip_ratio/region_mean", "learning_rate")


def _train(out: Path, *extra: str) -> list[dict]:
    result = run_grpo("train", "quickstart", *SETTINGS, *extra, f"train.output_dir={out}",
                      env={"OMP_NUM_THREADS": "1"}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (out / "stderr.log").write_text(result.stderr)
    return RunDir(out).read_metrics()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp")
    return {"ddp": _train(root / "ddp"), "fsdp2": _train(root / "fsdp2", "train.sharding=fsdp2"), "root": root}


def _assert_close(a: list[dict], b: list[dict]) -> None:
    assert [m["step"] for m in a] == [m["step"] for m in b]
    for x, y in zip(a, b):
        for key in COMPARED:
            assert x[key] == pytest.approx(y[key], rel=1e-5, abs=1e-6), (x["step"], key)


@pytest.mark.slow
def test_fsdp2_metrics_match_ddp(runs):
    _assert_close(runs["fsdp2"], runs["ddp"])
    assert [m["step"] for m in runs["fsdp2"]] == [1, 2, 3]
    assert any(m["grad_norm"] > 0 for m in runs["fsdp2"])  # it trained
    resolved = (runs["root"] / "fsdp2" / "config.resolved.toml").read_text()
    assert 'sharding = "fsdp2"' in resolved and "num_processes = 2" in resolved
    for run, sharded in (("fsdp2", True), ("ddp", False)):  # generating with the sharded policy is said to be slow
        said = (runs["root"] / run / "stderr.log").read_text().count("gathers every layer's parameters")
        assert said == (1 if sharded else 0), run


@pytest.mark.slow
def test_fsdp2_checkpoint_is_whole_and_resume_is_exact(runs):
    from safetensors.torch import load_file

    run = runs["root"] / "fsdp2"
    ddp_weights = load_file(runs["root"] / "ddp/checkpoints/step-3/model.safetensors")
    fsdp_weights = load_file(run / "checkpoints/step-3/model.safetensors")
    assert set(ddp_weights) == set(fsdp_weights)  # a plain save_pretrained model, whole
    for name, tensor in ddp_weights.items():
        assert tensor.shape == fsdp_weights[name].shape
        assert (tensor - fsdp_weights[name]).abs().max() < 1e-5, name
    config = json.loads((run / "checkpoints/step-3/config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    # as if killed after step 2's checkpoint: resume under FSDP2 continues like the run in one go
    crashed = runs["root"] / "crashed"
    shutil.copytree(run, crashed)
    shutil.rmtree(crashed / "checkpoints/step-3")
    resumed = _train(crashed, "train.sharding=fsdp2")
    assert [m["step"] for m in resumed] == [1, 2, 3]
    for x, y in zip(resumed, runs["fsdp2"]):
        for key in COMPARED:
            assert x[key] == y[key], (x["step"], key)  # exact, not merely close


@pytest.mark.slow
def test_fsdp2_with_a_sequence_split_matches_fsdp2(runs):
    """train.sequence_parallel = 2 under FSDP2: every pass of the split is a collective of both processes
    (grpocli.trainer.split_passes), and the step is the unsplit one's."""
    split = _train(runs["root"] / "split", "train.sharding=fsdp2", "train.sequence_parallel=2")
    _assert_close(split, runs["fsdp2"])
    assert "sequence_parallel = 2" in (runs["root"] / "split" / "config.resolved.toml").read_text()


@pytest.mark.slow
def test_weight_sync_gathers_one_tensor_at_a_time():
    """Neither a colocated sync (every process walks the weights) nor a server sync (the main one
    sends buckets) holds a second whole copy: peak RSS growth stays below the model's size."""
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("peak RSS cannot be reset here (/proc/self/clear_refs is Linux only)")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           str(ROOT / "tests/trainer/fsdp_sync_memory.py"), "4", "512"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    print(*lines, sep="\n")
    assert len(lines) == 2
    for line in lines:
        whole = line["whole_model_mib"]
        assert line["every_process"]["peak_growth_mib"] < 0.75 * whole, line
        assert line["main_sends"]["peak_growth_mib"] < 0.75 * whole, line
    main = next(line for line in lines if line["rank"] == 0)
    assert main["main_sends"]["received"] > main["whole_model_mib"] * 2**20 * 0.9  # it did send everything


def test_fsdp_version_1_from_accelerate_is_refused(monkeypatch):
    from grpocli.errors import UserError
    from grpocli.parallel.fsdp2 import sharding_of
    from grpocli.recipe.schema import Recipe

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    with pytest.raises(UserError, match="FSDP version 1"):
        sharding_of(Recipe().train.sharding, accelerator=None)
    monkeypatch.setenv("FSDP_VERSION", "2")
    assert sharding_of(Recipe().train.sharding, accelerator=None) == "fsdp2"


# -- LoRA under FSDP2 -----------------------------------------------------------------------
LORA = "model.lora.enabled=true"


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp-lora")
    return {"ddp": _train(root / "ddp", LORA), "fsdp2": _train(root / "fsdp2", LORA, "train.sharding=fsdp2"),
            "root": root}


@pytest.mark.slow
def test_fsdp2_lora_metrics_match_ddp_and_only_adapters_train(lora_runs):
    import torch

    _assert_close(lora_runs["fsdp2"], lora_runs["ddp"])
    assert [m["step"] for m in lora_runs["fsdp2"]] == [1, 2, 3]
    assert all(m["grad_norm"] > 0 for m in lora_runs["fsdp2"])  # it trained
    resolved = (lora_runs["root"] / "fsdp2" / "config.resolved.toml").read_text()
    assert 'sharding = "fsdp2"' in resolved
    # under FSDP2 optimizer.pt is keyed by parameter names: the adapters are all that trains
    optim = torch.load(lora_runs["root"] / "fsdp2/checkpoints/step-3/trainer/optimizer.pt", weights_only=False)
    names = list(optim["state"])
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names), names[:4]


def _files(checkpoint: Path) -> list[str]:
    return sorted(str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file())


def _adapter_config(checkpoint: Path) -> dict:
    config = json.loads((checkpoint / "adapter_config.json").read_text())
    config["target_modules"] = sorted(config["target_modules"])  # peft writes a set: any order
    return config


@pytest.mark.slow
def test_fsdp2_lora_checkpoint_is_the_unsharded_one_and_resume_is_exact(lora_runs):
    import torch
    from safetensors.torch import load_file

    ddp, run = lora_runs["root"] / "ddp/checkpoints/step-3", lora_runs["root"] / "fsdp2/checkpoints/step-3"
    assert _files(run) == _files(ddp)  # the same files: peft's adapters, no model.safetensors
    assert "adapter_model.safetensors" in _files(run) and "model.safetensors" not in _files(run)
    assert _adapter_config(run) == _adapter_config(ddp)
    want, got = load_file(ddp / "adapter_model.safetensors"), load_file(run / "adapter_model.safetensors")
    assert set(want) == set(got)
    for name, tensor in want.items():
        assert tensor.shape == got[name].shape
        assert (tensor - got[name]).abs().max() < 1e-5, name
    assert any(t.abs().max() > 0 for n, t in got.items() if "lora_B" in n)  # trained (peft starts B at 0)
    # as if killed after step 2's checkpoint: resume under FSDP2 loads the adapters and continues exactly
    crashed = lora_runs["root"] / "crashed"
    shutil.copytree(lora_runs["root"] / "fsdp2", crashed)
    shutil.rmtree(crashed / "checkpoints/step-3")
    resumed = _train(crashed, LORA, "train.sharding=fsdp2")
    assert [m["step"] for m in resumed] == [1, 2, 3]
    for x, y in zip(resumed, lora_runs["fsdp2"]):
        for key in COMPARED:
            assert x[key] == y[key], (x["step"], key)  # exact, not merely close
    again = load_file(crashed / "checkpoints/step-3/adapter_model.safetensors")
    assert all(torch.equal(again[n], got[n]) for n in got)


@pytest.mark.slow
def test_lora_weight_sync_sends_the_merged_weights_one_tensor_at_a_time():
    """Each adapter is added to its gathered base weight out of place (W, A, B gathered in turn on
    every process): what a sync sends equals merge_and_unload() of the same adapters unsharded, the
    sharded weights are exactly as they were, the in-process reference refresh gets the merged
    weights as shards, and no process holds a second whole copy."""
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("peak RSS cannot be reset here (/proc/self/clear_refs is Linux only)")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           str(ROOT / "tests/trainer/fsdp_sync_memory.py"), "4", "512", "lora"]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    print(*lines, sep="\n")
    assert len(lines) == 2
    for line in lines:
        lora = line["lora"]
        assert lora["names_differ"] == [], lora  # the base model's names, lm_head (tied) included
        assert lora["merged_max_diff"] < 1e-5, lora
        assert lora["merge_moves"] > 1e-3, lora  # the adapters did change what was sent
        assert lora["base_drift"] == 0.0 and not lora["still_merged"], lora  # no sync writes into the model
        assert lora["reference_mix_max_diff"] < 1e-5, lora  # the in-process refresh mixes the merged policy
        whole = line["whole_model_mib"]
        assert line["every_process"]["peak_growth_mib"] < 0.75 * whole, line
        assert line["main_sends"]["peak_growth_mib"] < 0.75 * whole, line

