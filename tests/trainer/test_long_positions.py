"""A sequence longer than the model's positions (data.max_prompt_length + generation.max_completion_length
past max_position_embeddings, or past what a rope_scaling factor stretches it to) is refused with exit 2
before any model loads (grpocli.generation.positions.check_positions, run by grpocli.trainer.preflight and grpo eval)."""

from __future__ import annotations

import json

import pytest
from cli_runner import grpo_in_process
from tiny_runs import TINY_MODEL

from grpocli.errors import UserError
from grpocli.generation.positions import check_positions, config_positions, model_positions
from grpocli.recipe import load_recipe

#: Qwen2.5-7B-Instruct's config.json, the keys that matter here (its public config: 32K positions).
QWEN25_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "max_position_embeddings": 32768,
             "rope_theta": 1000000.0, "hidden_size": 3584, "num_hidden_layers": 28}
#: What Qwen2.5's model cards add to config.json for 128K: YaRN, factor 4 over the 32K it was trained on.
QWEN25_YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}


def test_train_refuses_a_sequence_past_the_tiny_models_positions_before_it_loads(tmp_path, monkeypatch, capsys):
    loaded = []
    monkeypatch.setattr("grpocli.models.tiny.build_tiny_model", lambda *a, **k: loaded.append("policy"))
    monkeypatch.setattr("grpocli.models.loader._load_base", lambda *a, **k: loaded.append("base"))
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    run = tmp_path / "run"
    code, out = grpo_in_process(monkeypatch, capsys, "train", "quickstart", *TINY_MODEL, "log.progress=none",
                                "model.tiny.max_position_embeddings=64", "data.max_prompt_length=48",
                                "generation.max_completion_length=24", f"train.output_dir={run}")
    assert code == 2 and "Traceback" not in out, out[-3000:]
    assert out.count("error: ") == 1, out
    assert ("error: data.max_prompt_length + generation.max_completion_length: the engine's context and the "
            "longest training sequence (48 + 24 = 72 tokens) are longer than the model's positions: "
            "model.tiny.max_position_embeddings = 64") in out, out
    assert "valid: data.max_prompt_length + generation.max_completion_length at most 64" in out, out
    assert "next: set generation.max_completion_length=16 or data.max_prompt_length=40, or " \
           "model.tiny.max_position_embeddings=72" in out, out
    assert loaded == []  # no model was built or loaded
    assert not (run / "checkpoints").exists() and not (run / "metrics.jsonl").exists()


def _recipe(*overrides: str):
    return load_recipe("quickstart", list(overrides)).recipe


def _model_dir(tmp_path, config: dict) -> str:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def test_a_config_json_gives_the_positions_and_yarn_rope_scaling_stretches_them(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    plain = _model_dir(tmp_path, QWEN25_7B)
    check_positions(_recipe(f"model.name_or_path={plain!r}", "generation.max_completion_length=32256"))  # 32768
    with pytest.raises(UserError) as refused:
        check_positions(_recipe(f"model.name_or_path={plain!r}", "generation.max_completion_length=32768"))
    text = str(refused.value)
    assert refused.value.where == "data.max_prompt_length + generation.max_completion_length"
    assert "(512 + 32768 = 33280 tokens)" in text and "says max_position_embeddings = 32768" in text, text
    assert "generation.max_completion_length=32256" in text, text
    assert '"rope_scaling": {"type": "yarn", "factor": 2, "original_max_position_embeddings": 32768}, with ' \
           '"max_position_embeddings": 65536' in text, text

    (tmp_path / "model" / "config.json").write_text(json.dumps({**QWEN25_7B, "rope_scaling": QWEN25_YARN}))
    positions = model_positions(_recipe(f"model.name_or_path={plain!r}").model)
    assert positions is not None and (positions.length, positions.unstretched) == (131072, 32768)
    assert "stretched by rope_scaling (yarn, factor 4) from 32768 to 131072" in positions.said
    check_positions(_recipe(f"model.name_or_path={plain!r}", "generation.max_completion_length=32768"))  # fits now
    with pytest.raises(UserError, match="from 32768 to 131072"):
        check_positions(_recipe(f"model.name_or_path={plain!r}", "generation.max_completion_length=131072"))


def test_a_colocated_vllm_engine_is_checked_by_vllms_rule_before_the_policy_loads(tmp_path, monkeypatch):
    """vLLM 0.32 multiplies no YaRN factor in: Qwen2.5's YaRN config as its model card gives it (32768 positions,
    factor 4) holds a 33K training sequence, but the colocated engine would refuse it only after the policy
    loaded; the check says so first, and what to write in config.json. With max_position_embeddings the
    stretched length (transformers 5's reading), both agree."""
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    folder = _model_dir(tmp_path, {**QWEN25_7B, "rope_scaling": QWEN25_YARN})
    long = [f"model.name_or_path={folder!r}", "generation.max_completion_length=32768"]
    check_positions(_recipe(*long))  # transformers' generate (generation.backend = "hf")
    with pytest.raises(UserError) as refused:
        check_positions(_recipe(*long, "generation.backend=vllm"))
    text = str(refused.value)
    assert refused.value.where == "data.max_prompt_length + generation.max_completion_length"
    assert "context (33280 tokens)" in text and "vLLM takes max_position_embeddings = 32768" in text, text
    assert '"max_position_embeddings": 131072 in that config.json' in text, text
    with pytest.raises(UserError, match="vllm.max_model_len"):
        check_positions(_recipe(*long[:1], "generation.backend=vllm", "vllm.max_model_len=65536"))

    (tmp_path / "model" / "config.json").write_text(
        json.dumps({**QWEN25_7B, "max_position_embeddings": 131072, "rope_scaling": QWEN25_YARN}))
    check_positions(_recipe(*long, "generation.backend=vllm"))  # what the hint says: both read 131072
    plain = {**QWEN25_7B}
    (tmp_path / "model" / "config.json").write_text(json.dumps(plain))
    with pytest.raises(UserError, match="longer than the model's positions"):  # the training check speaks first
        check_positions(_recipe(*long, "generation.backend=vllm"))
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    check_positions(_recipe(*long, "generation.backend=vllm"))


@pytest.mark.parametrize(("config", "length"), [
    ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, 8192),
    ({"max_position_embeddings": 4096, "rope_parameters": {"rope_type": "dynamic", "factor": 4.0,
                                                           "rope_theta": 1e4}}, 16384),  # transformers 5's key
    ({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                          "original_max_position_embeddings": 8192}}, 131072),
    ({"max_position_embeddings": 163840, "rope_scaling": {"type": "yarn", "factor": 40,
                                                          "original_max_position_embeddings": 4096}}, 163840),
    ({"max_position_embeddings": 32768, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, 32768),
    ({"n_positions": 1024, "n_embd": 768}, 1024),  # GPT-2: learned positions
    ({"text_config": {"max_position_embeddings": 8192, "seq_length": 4096}}, 4096),  # the smallest wins, as vLLM
], ids=["linear", "dynamic-rope_parameters", "llama3-already-stretched", "yarn-already-stretched", "default",
        "n_positions", "text_config"])
def test_config_positions(config, length):
    assert config_positions(config, source="config.json").length == length


def test_unknown_positions_are_not_checked_and_evaluation_length_counts(tmp_path, monkeypatch):
    assert config_positions({"hidden_size": 8}, source="config.json") is None
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert model_positions(_recipe(f"model.name_or_path={str(gguf)!r}").model) is None  # GGUF: read at load only
    check_positions(_recipe(f"model.name_or_path={str(gguf)!r}", "generation.max_completion_length=131072"))

    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    with pytest.raises(UserError) as refused:
        check_positions(_recipe("eval.every=5", "eval.max_tokens=600"))  # 512 + 600 past the tiny 1024
    assert refused.value.where == "data.max_prompt_length + eval.max_tokens"
    check_positions(_recipe("eval.max_tokens=600"))  # no periodic evaluation: `grpo train` never generates 600
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    check_positions(_recipe("eval.every=5", "eval.max_tokens=600"))  # allowed, as vLLM allows it


@pytest.mark.parametrize("target", ["--base", "--checkpoint"])
def test_grpo_eval_refuses_completions_past_the_models_positions_before_it_loads(target, tmp_path, monkeypatch, capsys):
    """The base model ([model.tiny]: 1024 positions) or a checkpoint (its config.json) and --max-tokens: exit 2
    naming the option, before any model loads; eval.max_tokens is named where it sets the length."""
    from vllm_serve_process import tiny_checkpoint

    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    ckpt = tiny_checkpoint(tmp_path / "ckpt")  # a checkpoint of the tiny model: 1024 positions in its config.json
    loaded = []
    monkeypatch.setattr("grpocli.models.tiny.build_tiny_model", lambda *a, **k: loaded.append("policy"))
    monkeypatch.setattr("grpocli.models.loader._load_base", lambda *a, **k: loaded.append("base"))
    chosen = ["--base"] if target == "--base" else ["--checkpoint", str(ckpt)]
    out_dir = ["--output-dir", str(tmp_path / "eval")]
    code, out = grpo_in_process(monkeypatch, capsys, "eval", "quickstart", *chosen, "--max-tokens", "600", *out_dir)
    assert code == 2 and "Traceback" not in out, out[-3000:]
    assert ("error: data.max_prompt_length + --max-tokens: the engine's context and the longest evaluated sequence "
            "(512 + 600 = 1112 tokens) are longer than the model's positions") in out, out
    assert "next: set --max-tokens 512 or data.max_prompt_length=424" in out, out
    code, out = grpo_in_process(monkeypatch, capsys, "eval", "quickstart", *chosen, "eval.max_tokens=600", *out_dir)
    assert code == 2 and "error: data.max_prompt_length + eval.max_tokens: " in out, out
    assert loaded == [] and not (tmp_path / "eval").exists()
