"""`grpo bench` against real parts: real steps of a tiny recipe measured (forced lengths, FLOPs,
the figures and their JSON), FLOPs against a real model's layers (head_dim set apart from
hidden_size / num_heads too), the forecast's length correction, the measured peak, and bad
input. `--vs-trl` runs in tests/test_gpu_kit.py."""

from __future__ import annotations

import pytest

from grpocli.benchmark.flops import GroupTokens, group_tokens, matmul_weights, passes_flops
from grpocli.benchmark.forecast import counts, forecast, step_seconds
from grpocli.benchmark.measurement import MeasuredStep, Measurement
from grpocli.benchmark.presets import SHAPES, shape_overrides
from grpocli.planning import shape_of_config


def _tiny_model(shape: str = "cpu-tiny"):
    from grpocli.models.loader import load_policy
    from grpocli.recipe import load_recipe

    r = load_recipe("quickstart", shape_overrides(shape)).recipe
    return load_policy(r.model, seed=0)


def test_real_steps_of_a_tiny_recipe_are_measured_phase_by_phase(tmp_path):
    import json
    import time

    import torch

    from grpocli.benchmark.measurement import measure
    from grpocli.benchmark.peak import matmul_peak
    from grpocli.benchmark.report import figures, text
    from grpocli.recipe import load_recipe

    run = tmp_path / "run"
    resolved = load_recipe("quickstart", [*shape_overrides("cpu-tiny"), "train.steps=2", f"train.output_dir={run}",
                                          "generation.max_completion_length=8", "log.progress=none"])
    m = measure(resolved, started=time.perf_counter(), forced=True)
    assert [r.step for r in m.steps] == [1, 2]
    for r in m.steps:  # EOS suppressed: every completion 8 tokens, 8 prompts x 8
        assert r.completion_tokens == 64 * 8 and r.longest_completion == 8 and r.mean_completion == 8
        assert r.flops["generation"] > 0 and r.phases["generation"] > 0 and r.peak_memory > 0
        assert sum(r.phases.values()) == pytest.approx(r.seconds, rel=1e-6)
    assert m.checkpoint_s > 0 and (run / "checkpoints" / "step-2").is_dir() and m.evaluation_s is None
    fc = forecast(m, steps=100, max_completion_length=8, eval_every=0, save_steps=0)
    assert fc.s_per_step_at_max == pytest.approx(fc.s_per_step)  # already at the longest
    f = figures("quickstart", m, matmul_peak("cpu", torch.float32, sizes=(128,), seconds=0.05), fc)
    assert json.loads(json.dumps(f))["flops_per_step"] == pytest.approx(sum(m.steps[1].flops.values()))
    assert 0 < f["mfu"] and "forecast for train.steps = 100" in text(f)
    from grpocli.planning.headroom import diagnose  # the Bottleneck section `grpo bench` prints, from these lines
    from grpocli.rundir import read_jsonl

    found = diagnose(read_jsonl(run / "metrics.jsonl"), resolved.recipe)
    assert (found.bottleneck.first, found.bottleneck.last) == (2, 2) and found.lines()[0].startswith("Bottleneck: ")


def _linear_weights(model) -> int:
    import torch

    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_matmul_weights_are_the_weights_of_the_models_linear_layers():
    model = _tiny_model()
    shape = shape_of_config(model.config, source="test")
    assert shape.num_kv_heads == 1 and shape.vocab_size == SHAPES["cpu-tiny"]["vocab_size"]
    assert matmul_weights(shape) == _linear_weights(model)  # the head is tied to the embedding but still a matmul


def test_flops_use_the_models_head_dim_where_it_is_not_hidden_over_heads():
    """Qwen3 sets head_dim apart: 4 heads of 32 over a hidden size of 64, so q and o are 64 x 128
    and k and v 64 x 64 (2 key-value heads), where hidden_size / num_heads would say 16."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, intermediate_size=96)
    shape = shape_of_config(config, source="test")
    assert (shape.num_heads, shape.head_dim) == (4, 32)
    # per layer: q 64x128, k 64x64, v 64x64, o 128x64, gate/up/down 3 x 64x96; the head 64x100
    weights = 2 * (64 * 128 + 64 * 64 + 64 * 64 + 128 * 64 + 3 * 64 * 96) + 64 * 100
    assert matmul_weights(shape) == weights == _linear_weights(Qwen3ForCausalLM(config))  # the real parameters
    grp = GroupTokens(prompt=3, completions=[2, 1])  # 6 tokens, 19 positions attended
    flops = 2 * weights * 6 + 4 * 2 * (4 * 32) * 19   # attention over num_heads x head_dim = 128, not 64
    assert passes_flops(shape, [grp]) == flops
    # the formula that assumed head_dim = hidden_size / num_heads = 16 counted less
    h, kv = 64, 2 * 16
    old = 2 * (2 * (2 * h * h + 2 * h * kv + 3 * h * 96) + h * 100) * 6 + 4 * 2 * h * 19
    assert old < flops and old != passes_flops(shape, [grp])


def test_a_padded_vocabulary_decodes_its_filler_tokens_and_encodes_text_as_before():
    from grpocli.models.tokenizer import build_char_tokenizer

    plain, padded = build_char_tokenizer(), build_char_tokenizer(vocab_size=512)
    assert (len(plain), len(padded)) == (104, 512)
    assert padded.decode([300, 40, 511]) == "<t300>" + plain.decode([40]) + "<t511>"
    assert padded.encode("What is <t300>?") == plain.encode("What is <t300>?")  # no merges: never a filler


def test_a_group_counts_its_prompt_once_and_attention_over_earlier_positions():
    from transformers import LlamaConfig

    shape = shape_of_config(LlamaConfig(vocab_size=10, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                                        num_key_value_heads=2, intermediate_size=16), source="test")
    assert matmul_weights(shape) == 2 * (4 * 8 * 8 + 3 * 8 * 16) + 8 * 10
    grp = GroupTokens(prompt=3, completions=[2, 1])
    assert grp.tokens == 6
    # prompt: 1+2+3; completion of 2: 4+5; completion of 1: 4
    assert grp.attended == 6 + 9 + 4
    assert passes_flops(shape, [grp], passes=3.0) == 3 * (2 * matmul_weights(shape) * 6 + 4 * 2 * 8 * 19)
    # rows that do not enter the loss do not count; a group with none is gone
    kept = group_tokens([3, 1], [2, 1, 5, 5], keep=[True, False, False, False])
    assert kept == [GroupTokens(3, [2])]


def _record(step: int, generation: float, longest: int, training: float, trained: int) -> MeasuredStep:
    phases = {"generation": generation, "rewards": 0.1, "logprobs": 0.0, "training": training,
              "weight_sync": 0.0, "other": 0.1}
    return MeasuredStep(step=step, seconds=sum(phases.values()), phases=phases, completion_tokens=64 * longest / 2,
                        longest_completion=longest, mean_completion=longest / 2, trained_tokens=trained,
                        trained_completion_tokens=trained - 100, flops={"generation": 1.0, "logprobs": 0.0,
                                                                        "training": 1.0}, peak_memory=1)


def test_the_forecast_scales_generation_by_the_longest_completion_and_training_by_tokens():
    steps = [_record(1, 99.0, 40, 99.0, 1000), _record(2, 4.0, 40, 2.0, 1000), _record(3, 2.0, 20, 1.0, 500)]
    # rates over steps 2-3 (step 1 is warm-up): 6 s / 60 tokens, 3 s / 1500 tokens; 0.2 s fixed
    assert step_seconds(steps, 20, 500) == pytest.approx(0.1 * 20 + 0.002 * 500 + 0.2)
    m = Measurement(steps=steps, startup_s=10.0, shape=None, parameters=1, dtype="float32", device="cpu",
                    memory_kind="rss", evaluation_s=5.0, checkpoint_s=1.0)
    fc = forecast(m, steps=60, max_completion_length=40, eval_every=20, save_steps=30)
    assert (fc.evaluations, fc.checkpoints) == (3, 2)
    assert fc.s_per_step == pytest.approx(3.2)  # at the last step's lengths, not the mean of the measured ones
    assert fc.total_s == pytest.approx(10 + 60 * 3.2 + 3 * 5 + 2 * 1)
    # every completion at 40 tokens (4x the last mean of 10): 4 s generation, 100 + 400 * 4 trained tokens
    assert fc.s_per_step_at_max == pytest.approx(0.1 * 40 + 0.002 * 1700 + 0.2)
    assert counts(10, 0, 0) == (0, 1)  # the final checkpoint is always written


def test_an_overlapped_step_is_the_longer_side_from_the_measured_overlap():
    """async_steps / in flight: generation ran beside training, so a step costs the longer of the trainer's
    side (log-prob passes and training per token, plus the per-step phases) and the engine's busy time
    (wall time less its idle time, per token of the longest completion)."""
    from dataclasses import replace

    steps = [replace(_record(i, 0.5, 20, 3.0, 1000), seconds=5.0, engine_idle=1.0, overlapped=True) for i in (1, 2, 3)]
    # trainer: 3 s / 1000 tokens + 0.2 s; engine busy: 4 s over a longest completion of 20
    assert step_seconds(steps, 20, 1000) == pytest.approx(max(3.0 + 0.2, 4.0))
    assert step_seconds(steps, 40, 1000) == pytest.approx(8.0)   # longer answers: the engine's side
    assert step_seconds(steps, 20, 3000) == pytest.approx(9.2)   # more trained tokens: the trainer's
    one_side = [replace(r, overlapped=False) for r in steps]    # generated in the step: the sum
    assert step_seconds(one_side, 20, 1000) == pytest.approx(0.5 + 3.0 + 0.2)


def test_the_peak_is_a_measured_rate():
    import torch

    from grpocli.benchmark.peak import matmul_peak

    peak = matmul_peak("cpu", torch.float32, sizes=(64, 128), seconds=0.05)
    assert peak.flops_per_s > 1e6 and peak.size in (64, 128)
    assert peak.dtype == "float32" and peak.device.startswith("cpu")


def test_an_unknown_recipe_or_steps_out_of_range_is_a_clear_error(grpo, tmp_path):
    done = grpo("bench", "no_such_recipe")
    assert done.returncode == 2 and "no_such_recipe" in done.stderr and "Traceback" not in done.stderr
    done = grpo("bench", "quickstart", "--steps", "0")
    assert done.returncode == 2 and "--steps" in done.stderr


def test_the_kit_plans_at_the_recipes_longest_prompt():
    """gpu-kit/run.sh passes data.max_prompt_length cut to the longest prompt, so `grpo plan` (every
    prompt at that length) and `grpo bench` (rows as wide as their longest prompt) size one step."""
    from grpocli.benchmark.presets import longest_prompt
    from grpocli.data.source import load_dataset_for
    from grpocli.data.template import render_row
    from grpocli.models import load_tokenizer
    from grpocli.recipe import load_recipe
    from grpocli.registry import load_plugins

    keys = shape_overrides("cpu-tiny")
    r = load_recipe("quickstart", keys).recipe
    tok = load_tokenizer(r.model)
    rows = load_dataset_for(r.data, load_plugins().datasets, r.data.split, r.train.seed)
    lengths = {len(tok(render_row(row, r.data, tok)["prompt_text"], add_special_tokens=False)["input_ids"])
               for row in rows.select(range(50))}
    n = longest_prompt("quickstart", keys)
    assert max(lengths) <= n < r.data.max_prompt_length  # quickstart's prompts are far under 512 tokens
    assert longest_prompt("quickstart", [*keys, "data.max_prompt_length=10"]) == 10
