"""`grpo import trl SCRIPT.py [-- ARGS]` on the TRL scripts users have, as files (tests/recipe/trl_scripts):
TRL's quickstart (train_grpo.py from TRL's GRPO page), a TrlParser script with a YAML and its own reward
functions, open-r1's grpo.py pattern with an open-r1 recipe; and open-r1's config_demo.yaml as a YAML.
Each is imported by the command a user runs, then trains 2 steps on the tiny model: only the model, the data
(a local file of the same columns) and the sizes are set on the command line; the recipe is not edited.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib
from cli_runner import run_grpo

SCRIPTS = Path(__file__).parent / "trl_scripts"
pytestmark = pytest.mark.skipif(__import__("importlib.util").util.find_spec("trl") is None,
                                reason="TRL is not installed (pip install 'grpocli[bench]')")


def _import(tmp_path, source, *script_args, out="recipe.toml"):
    result = run_grpo("import", "trl", str(source), "-o", out, *(("--", *script_args) if script_args else ()),
                      cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return tomllib.loads((tmp_path / out).read_text()), result.stdout


def _train_two_steps(tmp_path, monkeypatch, recipe, model_dir, columns):
    """2 steps of the imported recipe on the tiny model and a local file with the columns its rewards read."""
    from grpocli.recipe import load_recipe
    from grpocli.trainer.loop import train

    monkeypatch.chdir(tmp_path)  # a reward copied beside the recipe is named relative to it, as grpo reads it
    data = tmp_path / "prompts.jsonl"
    def value(column, i):  # conversational prompts, as DeepMath's; open-r1's problem column is text
        return (str(2 * i) if column == "solution" else [{"role": "user", "content": f"{i}+{i}="}]
                if column == "prompt" else f"{i}+{i}=")
    data.write_text("".join(json.dumps({c: value(c, i) for c in columns}) + "\n" for i in range(8)))
    run = tmp_path / "run"
    train(load_recipe(str(tmp_path / recipe), [
        f"model.name_or_path='{model_dir}'", "model.dtype='float32'", "model.gradient_checkpointing=false",
        "model.attn_implementation='eager'", f"data.dataset='{data}'", "train.steps=2", "train.prompts_per_step=2",
        "train.micro_batch_size=4", "generation.num_generations=2", "generation.max_completion_length=4",
        "generation.backend='hf'", "train.mixed_precision='no'", f"train.output_dir='{run}'", "train.save_steps=0",
        "train.warmup_steps=0", "train.warmup_ratio=0", "train.seed=1",
        "log.progress='none'", "log.rollouts_every=0", "log.report_to=[]", "train.torch_threads=1",
        "data.max_prompt_length=32",
    ]))
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    return metrics


@pytest.mark.slow
def test_trl_quickstart_imports_and_trains(tmp_path, monkeypatch, tiny_model_dir):
    recipe, printed = _import(tmp_path, SCRIPTS / "train_grpo.py")
    assert recipe["model"]["name_or_path"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert recipe["data"] == {"dataset": "trl-lib/DeepMath-103K", "split": "train"}
    assert recipe["rewards"] == [{"name": "trl.rewards:accuracy_reward"}]
    assert recipe["train"]["num_train_epochs"] == 3.0  # TRL's default: max_steps -1, 3 epochs
    _train_two_steps(tmp_path, monkeypatch, "recipe.toml", tiny_model_dir, ["prompt", "solution"])


@pytest.mark.slow
def test_a_trlparser_script_with_a_yaml_and_its_own_rewards(tmp_path, monkeypatch, tiny_model_dir):
    recipe, printed = _import(tmp_path, SCRIPTS / "grpo_parser.py", "--config", str(SCRIPTS / "grpo_parser.yaml"))
    train, model = recipe["train"], recipe["model"]
    assert (train["prompts_per_step"], train["steps"], train["warmup_steps"], train["resume"]) == (2, 20, 2, "auto")
    assert recipe["algorithm"]["num_iterations"] == 2 and train["lr_scheduler"] == "cosine"
    assert "mixed_precision" not in train  # the YAML's bf16: false, not GRPOConfig's bf16 None (true)
    assert model["lora"] == {"enabled": True, "r": 8, "alpha": 16, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"]}
    assert [r["name"] for r in recipe["rewards"]] == ["recipe_rewards.py:answer_reward", "recipe_rewards.py:short_reward"]
    copied = (tmp_path / "recipe_rewards.py").read_text()
    assert "BONUS = 0.5" in copied and "trainer.train()" in copied  # inside main(), which the copy never calls
    assert "parse_args_and_config" not in copied  # the __main__ block is not copied
    metrics = _train_two_steps(tmp_path, monkeypatch, "recipe.toml", tiny_model_dir, ["prompt", "solution"])
    assert "rewards/recipe_rewards.py:short_reward/mean" in metrics[0] or any("short_reward" in k for k in metrics[0])


def _openr1_checks(recipe, printed):
    assert recipe["data"]["prompt_column"] == "problem" and recipe["data"]["system_prompt"].startswith("You are")
    assert recipe["data"]["max_prompt_length"] == 512 and recipe["model"]["dtype"] == "bfloat16"
    names = {r["name"]: r for r in recipe["rewards"]}
    assert list(names) == ["math.accuracy", "format.strict", "format.tag_count", "reasoning.steps",
                           "trl.rewards:get_cosine_scaled_reward", "trl.rewards:get_repetition_penalty_reward"]
    assert names["trl.rewards:get_cosine_scaled_reward"]["args"] == {
        "min_value_wrong": 0.0, "max_value_wrong": -0.5, "min_value_correct": 0.5, "max_value_correct": 1.0,
        "max_len": 1024}  # open-r1's defaults, and the recipe's cosine_max_len
    assert names["trl.rewards:get_repetition_penalty_reward"]["args"] == {"ngram_size": 4, "max_penalty": -1.0}
    assert [r.get("weight") for r in recipe["rewards"]] == [1.0, 1.0, 1.0, 0.5, 0.5, 0.2]
    assert recipe["train"]["save_steps"] == 0 and recipe["train"]["num_train_epochs"] == 1.0  # save_strategy epoch
    assert "per_device_eval_batch_size: a TrainingArguments field TRL inherits" in printed
    assert "push_to_hub: grpo does not push" in printed and "hf upload" in printed


@pytest.mark.slow
def test_an_openr1_config_demo_yaml_imports_and_trains_unedited(tmp_path, monkeypatch, tiny_model_dir):
    recipe, printed = _import(tmp_path, SCRIPTS / "config_demo.yaml")
    _openr1_checks(recipe, printed)
    assert "torch_dtype: model.dtype = 'bfloat16'" in printed
    metrics = _train_two_steps(tmp_path, monkeypatch, "recipe.toml", tiny_model_dir, ["problem", "solution"])
    assert "rewards/format.tag_count/mean" in metrics[0]


@pytest.mark.slow
def test_openr1_grpo_py_pattern_imports_and_trains(tmp_path, monkeypatch, tiny_model_dir):
    # TRL 1.16's parser refuses two fields of open-r1's older recipes (torch_dtype, overwrite_output_dir), as
    # running open-r1's grpo.py on TRL 1.16 would: the script gets the recipe as TRL 1.16 takes it
    config = tmp_path / "config_demo.yaml"
    config.write_text("\n".join(line.replace("torch_dtype:", "dtype:") for line in
                                (SCRIPTS / "config_demo.yaml").read_text().splitlines()
                                if not line.startswith("overwrite_output_dir")))
    recipe, printed = _import(tmp_path, SCRIPTS / "grpo_openr1.py", "--config", str(config))
    _openr1_checks(recipe, printed)
    assert "dataset.map(make_conversation): not run by grpo" in printed
    _train_two_steps(tmp_path, monkeypatch, "recipe.toml", tiny_model_dir, ["problem", "solution"])


def test_a_script_cannot_reach_the_network_and_its_error_names_the_line(tmp_path):
    script = tmp_path / "reach.py"
    script.write_text("import socket\nfrom trl import GRPOConfig\n\nsocket.create_connection(('10.255.255.1', 80), 5)\n")
    result = run_grpo("import", "trl", str(script), "-o", str(tmp_path / "r.toml"), timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "at line 4" in result.stderr and "network is off" in result.stderr
    assert not (tmp_path / "r.toml").exists()


def test_the_help_says_how_a_script_is_run():
    out = run_grpo("import", "trl", "--help", env={"COLUMNS": "200"})
    text = " ".join(out.stdout.split())
    assert "as `python SCRIPT.py ARGS` would" in text and "stand-ins" in text and "the network is off" in text
