"""`grpo eval` end to end on the real tiny model: a base model and a saved checkpoint, sampled,
scored with the recipe's rewards, written to a run directory and compared in one table; and
evaluation during training on a live model."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from grpocli.errors import UserError
from grpocli.parallel import Parallel
from grpocli.recipe import load_recipe

OVERRIDES = ["generation.max_completion_length=12", "data.args={num_samples=40}"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A run directory whose checkpoint step-3 holds the tiny base model, as save_pretrained writes it."""
    from grpocli.models import load_policy, load_tokenizer

    recipe = load_recipe("quickstart", OVERRIDES).recipe
    path = tmp_path_factory.mktemp("run") / "checkpoints" / "step-3"
    load_policy(recipe.model, recipe.train.seed).save_pretrained(path)
    load_tokenizer(recipe.model).save_pretrained(path)
    return path


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets-cache"))


def test_eval_compares_base_and_checkpoint(checkpoint):
    from grpocli.evaluation.eval_run import run_eval

    out = io.StringIO()
    summaries = run_eval("quickstart", OVERRIDES, checkpoints=[str(checkpoint)], base=True, n=4, k="1,2,4",
                         num_prompts=3, threshold=-0.5, console=Console(file=out, width=120))
    assert list(summaries) == ["base", "step-3"]
    root = checkpoint.parent.parent / "eval"
    for label, summary in summaries.items():
        directory = root / f"{label}-test"
        samples = [json.loads(line) for line in (directory / "samples.jsonl").read_text().splitlines()]
        assert len(samples) == 3 * 4
        on_disk = json.loads((directory / "summary.json").read_text())
        assert on_disk["split"] == "test" and on_disk["n"] == 4 and on_disk["k"] == [1, 2, 4]
        metrics = on_disk["metrics"]
        # pass@k recomputed from the written samples with math.comb
        for k in (1, 2, 4):
            per_prompt = []
            for p in range(3):
                c = sum(s["success"] for s in samples if s["prompt_index"] == p)
                per_prompt.append(1 - math.comb(4 - c, k) / math.comb(4, k))
            assert metrics[f"pass@{k}"] == pytest.approx(sum(per_prompt) / 3)
        assert metrics["pass@1"] == pytest.approx(metrics["mean@4"])
        assert metrics["pass@1"] <= metrics["pass@2"] <= metrics["pass@4"]
        assert all(s["success"] == (s["reward"] >= -0.5) for s in samples)
        # the recipe's reward: length with target 8, -|8 - characters| / 8
        assert all(s["rewards"]["length"] == pytest.approx(-abs(8 - len(s["completion"])) / 8) for s in samples)
        assert metrics["completions/clipped_ratio"] == pytest.approx(sum(s["truncated"] for s in samples) / 12)
    # the checkpoint holds the base weights and both sample with train.seed: identical numbers
    assert summaries["base"]["metrics"] == summaries["step-3"]["metrics"]
    table = out.getvalue()
    for needle in ("pass@4", "mean@4", "maj@4", "step-3 - base", "rewards/length/mean"):
        assert needle in table


def test_k_larger_than_n_is_a_user_error(checkpoint):
    from grpocli.evaluation.eval_run import run_eval

    with pytest.raises(UserError) as err:
        run_eval("quickstart", OVERRIDES, checkpoints=[str(checkpoint)], n=2, k="1,4", num_prompts=1)
    assert err.value.where == "--k" and "1 <= k <= n = 2" in err.value.what


def test_missing_checkpoint_names_the_available_ones(grpo, checkpoint):
    missing = checkpoint.parent / "step-99"
    out = grpo("eval", "quickstart", "--checkpoint", str(missing))
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert f"no checkpoint at {missing}" in out.stderr
    assert str(checkpoint) in out.stderr  # listed as valid


def test_run_directory_means_its_newest_checkpoint(checkpoint):
    from grpocli.evaluation.targets import resolve_targets

    (target,) = resolve_targets([str(checkpoint.parent.parent)], base=False)
    assert target.path == checkpoint and target.label == "step-3" and "newest checkpoint" in target.note


def test_evaluate_during_training(tmp_path):
    import torch

    from grpocli.evaluation.periodic import PeriodicEval
    from grpocli.generation.hf import HFBackend
    from grpocli.models import load_policy, load_tokenizer
    from grpocli.registry import load_plugins
    from grpocli.rewards import resolve

    recipe = load_recipe("quickstart", [*OVERRIDES, "eval.every=2", "eval.n=3", "eval.k=[1, 3]",
                                        "eval.num_prompts=2", "eval.success_threshold=-0.5"]).recipe
    r = recipe
    tokenizer = load_tokenizer(r.model)
    model = load_policy(r.model, r.train.seed)
    off = load_recipe("quickstart", OVERRIDES).recipe
    assert PeriodicEval.open(off, tokenizer=tokenizer, backend=None, reward_fns=[], parallel=Parallel.alone(),
                             run_root=tmp_path) is None  # eval.every = 0
    periodic = PeriodicEval.open(r, tokenizer=tokenizer, backend=HFBackend(model, tokenizer, max_prompt_length=64),
                                 reward_fns=resolve(r.rewards, load_plugins().rewards), parallel=Parallel.alone(),
                                 run_root=tmp_path)
    assert periodic.every == 2 and len(periodic.rows) == 2
    rng = torch.get_rng_state()
    metrics = periodic.run(2)
    assert torch.equal(rng, torch.get_rng_state())  # training's random stream is untouched
    for key in ("eval/reward", "eval/rewards/length/mean", "eval/pass@1", "eval/pass@3", "eval/mean@3",
                "eval/completions/mean_length", "eval/completions/clipped_ratio"):
        assert isinstance(metrics[key], float), key
    assert metrics["eval/num_prompts"] == 2.0
    samples = (tmp_path / "eval" / "step-2-test" / "samples.jsonl").read_text().splitlines()
    assert len(samples) == 2 * 3
    # seeded by train.seed + step: the same step gives the same numbers
    again = periodic.run(2)
    assert {k: v for k, v in again.items() if k != "time/eval"} == {
        k: v for k, v in metrics.items() if k != "time/eval"}


def test_checkpoint_model_section(tmp_path):
    """A checkpoint replaces model.name_or_path; without saved tokenizer files the base's tokenizer
    is used; LoRA is not added again."""
    from grpocli.evaluation.eval_run import model_section_for
    from grpocli.evaluation.targets import Target

    model = load_recipe("quickstart", ["model.lora.enabled=true"]).recipe.model
    (tmp_path / "config.json").write_text("{}")
    bare = model_section_for(model, Target("step-1", tmp_path, None))
    assert (bare.name_or_path, bare.tokenizer, bare.lora.enabled) == (str(tmp_path), "tiny", False)
    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert model_section_for(model, Target("step-1", tmp_path, None)).tokenizer is None
    base = model_section_for(model, Target("base", None, None))
    assert base.name_or_path == "tiny" and not base.lora.enabled


def test_eval_of_a_tools_recipe_says_it_samples_without_the_tools(checkpoint, capsys):
    from grpocli.evaluation.eval_run import run_eval

    run_eval("quickstart", [*OVERRIDES, 'tools=[{name="calculator"}]'], checkpoints=[str(checkpoint)], n=2,
             k="1", num_prompts=2, console=Console(file=io.StringIO(), width=120))
    assert "samples single-turn completions without them" in capsys.readouterr().err
