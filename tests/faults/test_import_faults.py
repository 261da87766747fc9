"""`grpo import trl` on configs with wrongly typed or impossible values, and on input that would
make it allocate without bound (issue 31 item 6): each is one clean message naming the field,
exit 2, and no recipe written (a recipe already at -o --force stays as it was). Each runs the
real command on a real file."""

from __future__ import annotations

import time

import pytest
from cli_runner import assert_user_error, run_grpo

#: A config line, then what the message must say (the field is always named in `where`).
BAD = {
    "num_generations: null": ("num_generations", "num_generations is null: TRL takes an integer"),
    "max_steps: ten": ("max_steps", "max_steps is 'ten' (str); TRL's parser refuses it too"),
    "max_steps: 10.0": ("max_steps", "max_steps is 10.0 (float): TRL takes an integer"),
    "report_to: 5": ("report_to", "TRL takes a string, or a list of strings, or null"),
    "reward_weights: 3": ("reward_weights", "TRL takes a list of numbers, or null"),
    "reward_funcs: 3": ("reward_funcs", "TRL takes a list of strings, or null"),
    "gradient_accumulation_steps: null": ("gradient_accumulation_steps", "is null: TRL takes an integer"),
    "epsilon: null": ("epsilon", "epsilon is null: TRL takes a number"),
    "model_init_kwargs: 3": ("model_init_kwargs", "model_init_kwargs is 3 (int)"),
    "model_init_kwargs: '{bad json'": ("model_init_kwargs", "its JSON does not parse"),
    "generation_batch_size: x": ("generation_batch_size", "'x' (str); TRL's parser refuses it too"),
    "warmup_steps: 0.5x": ("warmup_steps", "'0.5x' (str); TRL's parser refuses it too"),
    "warmup_steps: .inf": ("warmup_steps", "a finite number >= 0"),
    "lr_scheduler_type: 3": ("lr_scheduler_type", "lr_scheduler_type is 3 (int): TRL takes a string"),
    "vllm_mode: 1": ("vllm_mode", "vllm_mode is 1 (int): TRL takes a string"),
    "vllm_server_host: 5": ("vllm_server_host", "TRL takes a string"),
    "bf16: maybe": ("bf16", "bf16 is 'maybe' (str); TRL's parser refuses it too"),
    "log_completions: 3": ("log_completions", "log_completions is 3 (int): TRL takes true or false"),
    "gradient_accumulation_steps: 0": ("gradient_accumulation_steps", "an integer >= 1"),
    "generation_kwargs: {stop: 5}": ("generation_kwargs.stop", "a string or a list of strings"),
    "chat_template_kwargs: {enable_thinking: null}": ("chat_template_kwargs",
                                                      "data.chat_template_kwargs.enable_thinking no value (null)"),
    # typed right, refused by the recipe (checked before anything is written)
    "num_generations: 1": ("num_generations", "an integer >= 2 (TRL refuses it too)"),
    "max_completion_length: -1": ("max_completion_length", "generation.max_completion_length: Input should be greater"),
    "learning_rate: .nan": ("learning_rate", "train.learning_rate: Input should be a finite number"),
    "1: 2": ("", "has the key 1 (int), not a field name"),
}


def _import(tmp_path, text: str, *extra: str):
    config = tmp_path / "c.yaml"
    config.write_text(text)
    return run_grpo("import", "trl", str(config), "-o", str(tmp_path / "recipe.toml"), *extra, timeout=120), config


def _written(tmp_path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name not in ("c.yaml",))


@pytest.mark.parametrize("line", list(BAD))
def test_a_bad_value_is_one_message_naming_the_field_and_nothing_is_written(tmp_path, line):
    field, says = BAD[line]
    done, config = _import(tmp_path, f"per_device_train_batch_size: 4\nnum_generations: 4\n{line}\n")
    stderr = assert_user_error(done, says, f"{config}: {field}")
    assert _written(tmp_path) == [], (_written(tmp_path), stderr)  # no recipe, no trial file left


def test_a_bad_config_leaves_the_recipe_at_output_as_it_was(tmp_path):
    (tmp_path / "recipe.toml").write_text("# mine\n")
    done, _ = _import(tmp_path, "learning_rate: .nan\n", "--force")
    assert_user_error(done, "so", "was not written")
    assert (tmp_path / "recipe.toml").read_text() == "# mine\n"
    assert _written(tmp_path) == ["recipe.toml"]


def test_strings_trl_grpo_reads_as_numbers_import_as_numbers(tmp_path):
    """YAML reads 1e-5 (no dot) as a string and `trl grpo --config` converts it (as "10" for an
    int field): the import reads them the same (tests/recipe/test_trl_types.py checks against TRL)."""
    done, _ = _import(tmp_path, 'learning_rate: 1e-5\nmax_steps: "10"\nbf16: "no"\nnum_generations: 4\n')
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "recipe.toml").read_text()
    assert "learning_rate = 1e-05" in text and "steps = 10" in text, text


def _alias_bomb(levels: int = 9) -> str:
    """A 'billion laughs': 9 strings, 9 aliases of those, ... (9**levels strings once expanded)."""
    lines, before = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'], "a0"
    for k in range(1, levels):
        lines.append(f"a{k}: &a{k} [" + ",".join([f"*{before}"] * 9) + "]")
        before = f"a{k}"
    return "\n".join(lines) + f"\nchat_template_kwargs: {{x: *{before}}}\n"


@pytest.mark.parametrize("text", [_alias_bomb(), "report_to: &a [*a]\n"], ids=["billion-laughs", "self-holding"])
def test_a_yaml_alias_bomb_is_refused_fast_without_allocating_it(tmp_path, text):
    """A few hundred bytes that expand to 9**9 strings wrote a 388 MB recipe: refused at 10,000 values."""
    assert len(text) < 500
    started = time.monotonic()
    done, _ = _import(tmp_path, text)
    assert_user_error(done, "holds more than 10,000 values once its YAML aliases (*name) are expanded")
    assert time.monotonic() - started < 30  # the command's start (~1-2 s) on a loaded machine, not the expansion
    assert _written(tmp_path) == []


def test_an_oversized_or_too_deep_config_is_refused(tmp_path):
    done, _ = _import(tmp_path, "# a comment line\n" * 70_000)
    assert_user_error(done, "is 1,190,000 bytes: larger than a GRPOConfig's fields take")
    done, _ = _import(tmp_path, "report_to: " + "[" * 50_000 + "]" * 50_000 + "\n")
    assert_user_error(done, "nests its values deeper than Python can read")
    assert _written(tmp_path) == []
