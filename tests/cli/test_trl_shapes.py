"""TRL's command-line shapes, answered with grpo's: a TRL config given to `grpo train` says how to import
it; `--learning_rate 1e-6`, `learning_rate=1e-6` and `--train.learning_rate 1e-6` name the override
meant (exit 2, no traceback, before anything loads)."""

from __future__ import annotations

import pytest
from cli_runner import assert_user_error

TRL_YAML = """\
model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct
dataset_name: trl-lib/DeepMath-103K
learning_rate: 1.0e-6
num_generations: 8
reward_funcs: [accuracy_reward]
"""


def test_a_trl_config_given_to_train_says_how_to_import_it(grpo, tmp_path):
    (tmp_path / "config.yaml").write_text(TRL_YAML)
    out = grpo("train", "config.yaml", cwd=tmp_path)
    assert_user_error(out, "config.yaml: this is a TRL config (YAML of GRPOConfig fields: model_name_or_path, "
                      "dataset_name, learning_rate, num_generations, ...), not a grpo recipe (TOML)",
                      "next: grpo import trl config.yaml -o recipe.toml, then grpo train recipe.toml")
    (tmp_path / "train_grpo.py").write_text("from trl import GRPOConfig\nargs = GRPOConfig(learning_rate=1e-6)\n")
    out = grpo("train", "train_grpo.py", cwd=tmp_path)  # not run: only named
    assert_user_error(out, "this is a Python file, not a grpo recipe (TOML)",
                      "if it builds a TRL GRPOConfig: grpo import trl train_grpo.py -o recipe.toml")


@pytest.mark.parametrize(("args", "needles"), [
    (["--learning_rate", "1e-6"], ["--learning_rate is not an option of grpo train",
                                   'did you mean "train.learning_rate=1e-6"?',
                                   "next: grpo train quickstart train.learning_rate=1e-6"]),
    (["learning_rate=1e-6"], ["the override 'learning_rate=1e-6' names no section",
                              'did you mean "train.learning_rate=1e-6"?',
                              "next: grpo train quickstart train.learning_rate=1e-6"]),
    (["--train.learning_rate", "1e-6"], ['did you mean "train.learning_rate=1e-6"?']),
    (["--learning-rate=1e-6", "train.steps=3"], ['did you mean "train.learning_rate=1e-6"?']),
    (["--gradient_accumulation_steps", "4"], [
        'did you mean "train.prompts_per_step"? TRL\'s gradient_accumulation_steps is train.prompts_per_step in '
        "grpo: unit:", "next: grpo train quickstart train.prompts_per_step=VALUE"]),
    (["temperature=0.7"], ['did you mean "generation.temperature=0.7"?']),
    (["--logging_steps", "10"], ["TRL's logging_steps has no grpo setting: every step is logged"]),
    (["--dryrun"], ['--dryrun is not an option of grpo train (did you mean "--dry-run"?)']),
], ids=["dashed", "bare", "dashed-dotted", "dashes-and-equals", "trl-unit", "leaf", "trl-no-key", "own-option"])
def test_trl_and_bare_overrides_name_the_key_meant(grpo, args, needles):
    assert_user_error(grpo("train", "quickstart", *args), *needles, "valid: section.key=value")


def test_a_bare_key_is_answered_in_every_command_that_takes_overrides(grpo):
    out = grpo("plan", "quickstart", "steps=3")
    assert_user_error(out, 'did you mean "train.steps=3"?', "next: write it as train.steps=3")
