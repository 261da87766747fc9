"""A reward model (a local sequence-classification checkpoint, TRL's ``reward_funcs="path"``) as
a reward: built tiny and offline here, with the project's character tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from grpocli.errors import UserError
from grpocli.registry.names import Registry
from grpocli.rewards import resolve
from grpocli.rewards import reward_model as rm_module
from grpocli.rewards.reward_model import RewardModel

PROMPTS = ["1+2=", "33*4=", "7-1=", "9=", "12+30=", "5*5="]
COMPLETIONS = ["3", "132", "six", "nine!!", "42 is the answer", ""]


def build_reward_model(path: Path, *, seed: int = 0, causal: bool = False) -> Path:
    """A tiny Qwen2ForSequenceClassification (num_labels=1, pad token set) and the char tokenizer."""
    from transformers import (
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen2ForSequenceClassification,
    )

    from grpocli.models import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=512, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         use_sliding_window=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = (Qwen2ForCausalLM if causal else Qwen2ForSequenceClassification)(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def reward_dir(tmp_path_factory) -> Path:
    return build_reward_model(tmp_path_factory.mktemp("rm") / "tiny-rm")


def direct_scores(path: Path, texts: list[str]) -> list[float]:
    """logits[:, 0] of the checkpoint on the texts, one at a time (no padding at all)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    with torch.no_grad():
        return [model(**tokenizer(t, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item()
                for t in texts]


def test_rewards_are_the_models_logits_on_prompt_plus_completion(reward_dir):
    scores = RewardModel(reward_dir, batch_size=4)(PROMPTS, COMPLETIONS)
    expected = direct_scores(reward_dir, [p + c for p, c in zip(PROMPTS, COMPLETIONS)])
    assert scores == pytest.approx(expected, abs=1e-5)
    assert len({round(s, 6) for s in scores}) > 1  # the texts do score differently


def test_conversational_rows_go_through_the_reward_tokenizers_chat_template(reward_dir):
    from transformers import AutoTokenizer

    prompts = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": p}] for p in PROMPTS]
    completions = [[{"role": "assistant", "content": c}] for c in COMPLETIONS]
    tokenizer = AutoTokenizer.from_pretrained(reward_dir)
    texts = [tokenizer.apply_chat_template(p + c, tokenize=False) for p, c in zip(prompts, completions)]
    assert texts[0].endswith("<|im_start|>assistant\n3<|im_end|>\n")
    scores = RewardModel(reward_dir)(prompts, completions)
    assert scores == pytest.approx(direct_scores(reward_dir, texts), abs=1e-5)


def test_batch_size_does_not_change_the_rewards(reward_dir):
    prompts, completions = PROMPTS * 3, COMPLETIONS[::-1] * 3
    small = RewardModel(reward_dir, batch_size=2)(prompts, completions)
    large = RewardModel(reward_dir, batch_size=100)(prompts, completions)
    whole = RewardModel(reward_dir)(prompts, completions)
    assert small == pytest.approx(large, abs=1e-5) and large == pytest.approx(whole, abs=1e-5)


def test_resolve_names_a_model_by_its_directory_without_loading_it(reward_dir):
    rm_module._cache.clear()
    spec = SimpleNamespace(name=str(reward_dir), weight=1.0, args={}, gate=False, on_error="raise",
                           batch_size=2, device="cpu")
    fns = resolve([spec, spec], Registry("reward"))
    assert [f.name for f in fns] == ["tiny-rm", "tiny-rm#2"]
    assert isinstance(fns[0].fn, RewardModel) and fns[0].fn.batch_size == 2
    assert rm_module._cache == {}  # resolving (what --dry-run does) loads nothing
    fns[0].fn(PROMPTS[:2], COMPLETIONS[:2])
    fns[1].fn(PROMPTS[:2], COMPLETIONS[:2])
    assert len(rm_module._cache) == 1  # loaded once for both entries
    model, _ = next(iter(rm_module._cache.values()))
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    with pytest.raises(UserError, match="takes no argument 'scale'") as info:
        resolve([SimpleNamespace(**{**vars(spec), "args": {"scale": 2}})], Registry("reward"))
    assert "rewards[0].args.scale" in str(info.value)


def test_checkpoints_that_are_no_reward_model_are_refused(tmp_path):
    registry = Registry("reward")

    def refused(path: Path, *needles: str) -> None:
        spec = SimpleNamespace(name=str(path), weight=1.0, args={}, gate=False, on_error="raise", batch_size=None,
                               device=None)
        with pytest.raises(UserError) as info:
            resolve([spec], registry)
        text = str(info.value)
        assert "rewards[0].name" in text, text
        for needle in needles:
            assert needle in text, text

    causal = build_reward_model(tmp_path / "causal", causal=True)
    refused(causal, "Qwen2ForCausalLM checkpoint, not a sequence-classification", "valid:", "next:")
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(empty, "has no config.json", "save_pretrained")
    two = build_reward_model(tmp_path / "two-labels")
    config = json.loads((two / "config.json").read_text())
    config["id2label"] = {"0": "A", "1": "B"}
    (two / "config.json").write_text(json.dumps(config))
    refused(two, "has 2 labels", "num_labels=1")
    no_tok = build_reward_model(tmp_path / "no-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (no_tok / name).unlink()
    refused(no_tok, "has no tokenizer", "tokenizer.save_pretrained")
    no_weights = build_reward_model(tmp_path / "no-weights")
    (no_weights / "model.safetensors").unlink()
    refused(no_weights, "has no weights")


def test_dry_run_checks_the_directory_and_the_device(grpo, reward_dir, tmp_path):
    ok = grpo("train", "quickstart", f'rewards=[{{name="{reward_dir}", batch_size=2}}]', "--dry-run")
    assert ok.returncode == 0, ok.stderr
    causal = build_reward_model(tmp_path / "causal", causal=True)
    out = grpo("train", "quickstart", f'rewards=[{{name="{causal}"}}]', "--dry-run")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "rewards[0].name" in out.stderr and "not a sequence-classification" in out.stderr
    out = grpo("train", "quickstart", f'rewards=[{{name="{reward_dir}", device="gpu7"}}]', "--dry-run")
    assert out.returncode == 2 and "rewards[0].device" in out.stderr and "not a torch device" in out.stderr
    out = grpo("train", "quickstart", f'rewards=[{{name="{reward_dir}", batch_size=0}}]', "--dry-run")
    assert out.returncode == 2 and "batch_size" in out.stderr


def test_training_with_a_reward_model(tmp_path, reward_dir):
    from grpocli.recipe import load_recipe
    from grpocli.trainer.loop import train

    fast = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
            "model.tiny.intermediate_size=64", "generation.max_completion_length=8",
            "generation.num_generations=4", "train.prompts_per_step=4", "train.steps=2",
            "train.micro_batch_size=4", "log.progress=none", "data.args={num_samples=64}"]
    out = tmp_path / "run"
    train(load_recipe("quickstart", [*fast, f"train.output_dir={out}",
                                     f'rewards=[{{name="{reward_dir}", batch_size=3}}, {{name="length", weight=0.1}}]']))
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert {"rewards/tiny-rm/mean", "rewards/tiny-rm/std", "rewards/length/mean"} <= set(metrics[-1])
    assert metrics[-1]["rewards/tiny-rm/std"] > 0
