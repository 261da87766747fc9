"""`grpo plan` from configs alone: exact parameter counts of public shapes (configs written here, as
no hub is reachable), a 3B full fine-tune that does not fit on 24 GiB and fits with the knobs the
plan names, bad input, and train.memory_check doing nothing off CUDA."""

from __future__ import annotations

import json

import pytest

from grpocli.errors import UserError

#: Qwen2.5-0.5B's and Qwen2.5-3B's config.json (the numbers of their public configs).
QWEN25 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936, "hidden_act": "silu",
          "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": True,
          "torch_dtype": "bfloat16", "use_sliding_window": False, "sliding_window": 32768}
QWEN25_05B = {**QWEN25, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
              "num_attention_heads": 14, "num_key_value_heads": 2, "max_window_layers": 24}
QWEN25_3B = {**QWEN25, "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
             "num_attention_heads": 16, "num_key_value_heads": 2, "max_window_layers": 36}
#: A full fine-tune of 3B in float32 on one GPU: 8 completions of up to 512 + 512 tokens per micro-batch.
BIG_RUN = ["data.max_prompt_length=512", "generation.max_completion_length=512", "train.micro_batch_size=8",
           "algorithm.beta=0.04"]


def _config(tmp_path, name: str, values: dict):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(values))
    return folder


def _plan(overrides, config, gpu_memory=80 * 2**30, gpus=1):
    from grpocli.planning import make_plan, shape_of
    from grpocli.recipe import load_recipe

    r = load_recipe("quickstart", overrides).recipe
    return make_plan(r, shape_of(r.model, str(config)), gpus=gpus, gpu_memory=gpu_memory)


def test_parameter_counts_are_exact_from_the_config(tmp_path):
    plan = _plan([], _config(tmp_path, "q05", QWEN25_05B))
    assert plan.shape.params == 494_032_768  # Qwen2.5-0.5B, tied embeddings counted once
    assert plan.shape.tied_embeddings and plan.shape.embedding_params == 151936 * 896
    assert _plan([], _config(tmp_path, "q3", QWEN25_3B)).shape.params == 3_085_938_688
    weights = dict(plan.phases[-1].parts)["policy weights"]
    assert weights == 494_032_768 * 4  # model.dtype float32 (the recipe's default)


def test_sharding_lora_and_checkpointing_lower_the_training_peak(tmp_path):
    config = _config(tmp_path, "q05", QWEN25_05B)
    base = _plan(BIG_RUN, config).phases[-1]
    sharded = _plan([*BIG_RUN, "train.sharding=fsdp2"], config, gpus=4).phases[-1]
    assert sharded.get("policy weights") == -(-494_032_768 // 4) * 4
    assert sharded.get("optimizer state (AdamW)") * 4 == pytest.approx(base.get("optimizer state (AdamW)"), rel=1e-6)
    lora = _plan([*BIG_RUN, "model.lora.enabled=true"], config).phases[-1]
    assert lora.get("gradients") < base.get("gradients") / 50
    checkpointed = _plan([*BIG_RUN, "model.gradient_checkpointing=true"], config).phases[-1]
    assert checkpointed.total < base.total and sharded.total < base.total and lora.total < base.total


def test_offloading_and_a_sleeping_engine_change_the_phases_they_name(tmp_path):
    """train.activation_offloading and vllm.sleep_mode (keys of their own modules) as the memory model takes them."""
    from dataclasses import replace

    from grpocli.planning.memory import generation_phase, training_phase

    plan = _plan([*BIG_RUN, "generation.backend=vllm"], _config(tmp_path, "q05", QWEN25_05B))
    s, shape = plan.settings, plan.shape
    assert s.engine_bytes == int(0.3 * 80 * 2**30)  # vllm.gpu_memory_utilization's share
    assert training_phase(shape, s).get("vLLM engine share") == s.engine_bytes
    asleep = replace(s, engine_sleeps=True)
    assert training_phase(shape, asleep).get("vLLM engine share") == 0
    assert generation_phase(shape, asleep).get("vLLM engine share") == s.engine_bytes
    offloaded = training_phase(shape, replace(s, activation_offloading=True))
    assert offloaded.total < training_phase(shape, s).total


def test_a_3b_full_fine_tune_does_not_fit_on_24gib_and_fits_with_the_knobs_it_names(tmp_path, grpo):
    config = _config(tmp_path, "q3", QWEN25_3B)
    refused = grpo("plan", "quickstart", *BIG_RUN, "--config", str(config), "--gpu-memory", "24GiB")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "does not fit on 1 x 24.00 GiB" in refused.stdout
    assert "model.gradient_checkpointing=true  saves" in refused.stdout and "model.lora.enabled=true  saves" in refused.stdout
    assert refused.stderr.startswith("error: grpo plan: the recipe needs") and "Traceback" not in refused.stderr
    together = refused.stdout.split("together these fit:")[1].split()
    assert together and not any(k.startswith("train.num_processes") for k in together)  # on the one GPU
    fitted = _plan([*BIG_RUN, *together], config, gpu_memory=24 * 2**30)
    assert fitted.fits and fitted.peak.total <= 24 * 2**30
    assert fitted.as_dict()["fits"] and fitted.as_dict()["model"]["params"] == 3_085_938_688


def test_a_config_that_cannot_be_read_names_the_path(tmp_path):
    from grpocli.planning import shape_of
    from grpocli.recipe.schema import ModelSection

    with pytest.raises(UserError, match=f"no config.json at {tmp_path / 'missing'}"):
        shape_of(ModelSection(), str(tmp_path / "missing"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match=f"{bad} is not a readable JSON file"):
        shape_of(ModelSection(), str(bad))
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": None}))
    with pytest.raises(UserError, match=f"{tmp_path / 'odd' / 'config.json'} is not a config transformers reads"):
        shape_of(ModelSection(), str(tmp_path / "odd"))


def test_gpu_memory_reads_binary_and_decimal_units():
    from grpocli.cli.plan import parse_memory

    assert parse_memory("80GiB") == 80 * 2**30 and parse_memory("24G") == 24 * 2**30
    assert parse_memory("80GB") == 80 * 10**9 and parse_memory("512MiB") == 2**29
    for wrong in ("lots", "-3GiB", "80 parsecs"):
        with pytest.raises(UserError, match="as an amount of memory"):
            parse_memory(wrong)


def test_the_train_check_refuses_with_the_numbers_and_the_knobs(tmp_path):
    from grpocli.planning import check_fits
    from grpocli.recipe import load_recipe

    config = _config(tmp_path, "q3", QWEN25_3B)
    r = load_recipe("quickstart", BIG_RUN).recipe
    with pytest.raises(UserError) as refused:
        check_fits(r, gpus=1, gpu_memory=24 * 2**30, config=str(config))
    text = refused.value.render()
    assert text.startswith("train.memory_check: the recipe needs") and "more than the 24.00 GiB" in text
    assert "model.gradient_checkpointing=true (saves" in text and "train.memory_check=false skips" in text
    assert check_fits(r, gpus=1, gpu_memory=2**40, config=str(config)).fits  # 1 TiB: no complaint


def test_memory_check_does_nothing_off_cuda(tmp_path):
    from grpocli.parallel import Parallel
    from grpocli.recipe import load_recipe
    from grpocli.trainer.session import _check_memory

    r = load_recipe("quickstart", ["model.name_or_path=/nowhere", "train.memory_check=true"]).recipe
    _check_memory(r, Parallel.alone())  # a CPU: no plan, so not even the missing model is looked at


def test_the_paged_backend_holds_the_cache_of_every_completion_of_a_call(tmp_path):
    """'hf' generates 64 completions a call; 'paged' sizes its cache for the whole generation batch."""
    config = _config(tmp_path, "q05", QWEN25_05B)
    run = ["train.prompts_per_step=32", "generation.num_generations=8"]  # 256 completions a call
    hf = _plan([*run, "generation.backend=hf"], config).phases[0]
    paged = _plan([*run, "generation.backend=paged"], config).phases[0]
    cache = "generation KV cache and logits (hf or paged)"
    assert paged.get(cache) == pytest.approx(4 * hf.get(cache), rel=1e-6)
