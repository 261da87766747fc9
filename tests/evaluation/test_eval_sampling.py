"""`grpo eval` and evaluation during training sample with [eval]'s temperature, top_p and
max_tokens (unset: [generation]'s), the command line's flags over both."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from grpocli.errors import UserError
from grpocli.evaluation.evaluator import eval_sampling
from grpocli.parallel import Parallel
from grpocli.recipe import load_recipe

OVERRIDES = ["generation.max_completion_length=12", "data.args={num_samples=40}"]


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets-cache"))


def test_precedence_generation_then_eval_then_flags():
    gen = ["generation.temperature=0.9", "generation.top_p=0.8", "generation.max_completion_length=30"]
    r = load_recipe("quickstart", gen).recipe
    s = eval_sampling(r)
    assert (s.temperature, s.top_p, s.max_tokens) == (0.9, 0.8, 30)  # None: the [generation] value
    r = load_recipe("quickstart", [*gen, "eval.temperature=0.5", "eval.max_tokens=7"]).recipe
    s = eval_sampling(r)
    assert (s.temperature, s.top_p, s.max_tokens) == (0.5, 0.8, 7)
    s = eval_sampling(r, temperature=1.2, top_p=0.5, max_tokens=3)
    assert (s.temperature, s.top_p, s.max_tokens) == (1.2, 0.5, 3)


@pytest.mark.parametrize(("flag", "value"), [("temperature", 0.0), ("top_p", 1.5), ("max_tokens", 0)])
def test_flags_out_of_range_are_user_errors(flag, value):
    r = load_recipe("quickstart").recipe
    with pytest.raises(UserError) as err:
        eval_sampling(r, **{flag: value})
    assert err.value.where == "--" + flag.replace("_", "-")


def test_eval_keys_are_checked_by_the_recipe():
    with pytest.raises(UserError):
        load_recipe("quickstart", ["eval.top_p=0"])


def test_grpo_eval_max_tokens_and_temperature(tmp_path):
    from grpocli.evaluation.eval_run import run_eval

    summaries = run_eval("quickstart", [*OVERRIDES, "eval.temperature=0.7"], checkpoints=[], n=2, k="1",
                         num_prompts=2, max_tokens=3, output_dir=str(tmp_path), console=Console(file=io.StringIO()))
    summary = json.loads((tmp_path / "base-test" / "summary.json").read_text())
    assert summary["sampling"]["max_tokens"] == 3 and summary["sampling"]["temperature"] == 0.7
    samples = [json.loads(line) for line in (tmp_path / "base-test" / "samples.jsonl").read_text().splitlines()]
    assert all(s["length"] <= 3 for s in samples) and summaries["base"]["sampling"]["max_tokens"] == 3


def test_evaluation_during_training_uses_eval_sampling(tmp_path):
    from grpocli.evaluation.periodic import PeriodicEval
    from grpocli.generation.hf import HFBackend
    from grpocli.models import load_policy, load_tokenizer
    from grpocli.registry import load_plugins
    from grpocli.rewards import resolve

    r = load_recipe("quickstart", [*OVERRIDES, "eval.every=1", "eval.n=2", "eval.num_prompts=2",
                                   "eval.max_tokens=2", "eval.top_p=0.9"]).recipe
    tokenizer = load_tokenizer(r.model)
    backend = HFBackend(load_policy(r.model, r.train.seed), tokenizer, max_prompt_length=64)
    periodic = PeriodicEval.open(r, tokenizer=tokenizer, backend=backend, parallel=Parallel.alone(), run_root=tmp_path,
                                 reward_fns=resolve(r.rewards, load_plugins().rewards))
    metrics = periodic.run(1)
    assert metrics["eval/completions/mean_length"] <= 2
    summary = json.loads((tmp_path / "eval" / "step-1-test" / "summary.json").read_text())
    assert summary["sampling"]["max_tokens"] == 2 and summary["sampling"]["top_p"] == 0.9


def test_colocated_engine_too_short_for_eval_max_tokens():
    """Checked when training starts, before vLLM loads: the engine holds prompt + completion tokens."""
    from grpocli.evaluation.periodic import PeriodicEval, check_engine_length

    r = load_recipe("quickstart", [*OVERRIDES, "eval.every=5", "eval.max_tokens=100",
                                   "generation.backend='vllm'", "data.max_prompt_length=64"]).recipe
    with pytest.raises(UserError) as err:
        PeriodicEval.open(r, tokenizer=None, backend=None, reward_fns=[], parallel=Parallel.alone(), run_root=None)
    assert err.value.where == "eval.max_tokens" and "vllm.max_model_len=164" in err.value.hint
    ok = r.model_copy(update={"vllm": r.vllm.model_copy(update={"max_model_len": 164})})
    check_engine_length(ok, eval_sampling(ok))  # fits now
