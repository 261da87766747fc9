"""LoRA end to end on the tiny model: a LoRA run's checkpoints (adapters only) are evaluated with
`grpo eval --checkpoint RUN`, and `grpo export RUN OUT` writes a standalone merged model whose
logits equal the trained PEFT model's; full checkpoints export too; mistakes are exit-2 errors."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
import torch
from rich.console import Console
from tiny_runs import FAST

from grpocli.cli.export import run_export
from grpocli.errors import UserError
from grpocli.recipe import load_recipe

pytest.importorskip("peft", reason="LoRA needs peft: pip install 'grpocli[peft]'")

LORA = ["model.lora={enabled=true, r=4, alpha=8}", "train.learning_rate=0.02", "train.seed=3"]
IDS = [[5, 17, 42, 9, 3, 77, 12], [60, 2, 2, 31]]


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets-cache"))


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    """A LoRA run trained for 2 steps: checkpoints/step-2 holds adapter files only."""
    from grpocli.trainer.loop import train

    out = tmp_path_factory.mktemp("lora") / "run"
    train(load_recipe("quickstart", [*FAST, *LORA, f"train.output_dir={out}"]))
    return out


def _logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]  # [T, V]


def _trained_peft(run: Path):
    """The trained policy as training holds it: a peft model, the checkpoint's adapters loaded the
    way resume loads them (grpocli.trainer.checkpoint.load_weights)."""
    from grpocli.models import load_policy
    from grpocli.models.files import load_weights

    r = load_recipe(str(run / "config.resolved.toml")).recipe
    policy = load_policy(r.model, r.train.seed)
    load_weights(policy, run / "checkpoints" / "step-2")
    return policy.eval(), r


def test_lora_checkpoint_holds_only_the_adapter(lora_run):
    ckpt = lora_run / "checkpoints" / "step-2"
    assert (ckpt / "adapter_config.json").exists() and (ckpt / "adapter_model.safetensors").exists()
    assert not (ckpt / "config.json").exists()


def test_eval_checkpoint_of_a_lora_run(lora_run):
    """The recipe's tiny shape (quickstart's default) differs from the run's: the base model is the run's."""
    from grpocli.evaluation.eval_run import run_eval

    summaries = run_eval("quickstart", ["generation.max_completion_length=6", "data.args={num_samples=40}"],
                         checkpoints=[str(lora_run)], n=2, k="1,2", num_prompts=2,
                         console=Console(file=io.StringIO()))
    summary = summaries["step-2"]
    assert summary["model"] == str(lora_run / "checkpoints" / "step-2") and summary["base_model"] == "tiny"
    samples = (lora_run / "eval" / "step-2-test" / "samples.jsonl").read_text().splitlines()
    assert len(samples) == 2 * 2


def test_export_lora_run_equals_the_trained_peft_model(lora_run, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpocli.models import load_policy

    out = run_export(str(lora_run), str(tmp_path / "merged"))
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    assert not (out / "adapter_config.json").exists()
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    peft_model, r = _trained_peft(lora_run)
    base = load_policy(r.model.model_copy(update={"lora": r.model.lora.model_copy(update={"enabled": False})}),
                       r.train.seed).eval()
    for ids in IDS:
        merged = _logits(exported, ids)
        assert torch.allclose(merged, _logits(peft_model, ids), atol=1e-5, rtol=1e-5)
        assert (merged - _logits(base, ids)).abs().max() > 1e-3  # training moved the weights
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer("12+7=")["input_ids"] and tokenizer.chat_template  # the template inside tokenizer_config
    assert "chat_template" in json.loads((out / "tokenizer_config.json").read_text())


def test_export_full_checkpoint(tmp_path):
    from transformers import AutoModelForCausalLM

    from grpocli.models import load_policy, load_tokenizer

    r = load_recipe("quickstart", FAST).recipe
    ckpt = tmp_path / "run" / "checkpoints" / "step-3"
    model = load_policy(r.model, r.train.seed).eval()
    model.save_pretrained(ckpt)
    load_tokenizer(r.model).save_pretrained(ckpt)
    (ckpt / "trainer").mkdir()
    out = run_export(str(ckpt), str(tmp_path / "full"))
    assert not (out / "trainer").exists()
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    assert torch.equal(_logits(exported, IDS[0]), _logits(model, IDS[0]))


def test_adapter_outside_its_run(lora_run, tmp_path):
    """Without its run's config.resolved.toml and a base in adapter_config.json: --base-model, and
    a base that does not fit is named."""
    bare = tmp_path / "adapters"
    shutil.copytree(lora_run / "checkpoints" / "step-2", bare, ignore=shutil.ignore_patterns("trainer"))
    with pytest.raises(UserError) as err:
        run_export(str(bare), str(tmp_path / "a"))
    assert "which base model" in err.value.what and "--base-model" in err.value.hint
    with pytest.raises(UserError) as err:
        run_export(str(bare), str(tmp_path / "b"), base_model="tiny")  # quickstart's default shape: other dims
    assert "do not fit the base model tiny" in err.value.what
    assert not (tmp_path / "b").exists()


def test_export_errors(lora_run, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(UserError, match="exists and is not empty"):
        run_export(str(lora_run), str(tmp_path / "full"))
    with pytest.raises(UserError, match="no checkpoint at"):
        run_export(str(tmp_path / "missing"), str(tmp_path / "out"))
    started = tmp_path / "started"
    started.mkdir()
    (started / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(UserError, match="has no complete checkpoint"):
        run_export(str(started), str(tmp_path / "out"))


def test_export_cli_exit_code_2(grpo, lora_run, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "model.safetensors").write_text("")
    out = grpo("export", str(lora_run), str(tmp_path / "taken"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "exists and is not empty" in out.stderr and "grpo export OUT_DIR" in out.stderr
