"""Recipe values a user meets (issue 22, item 8): a boolean read as a number, an environment
variable whose value does not parse, a key typed with look-alike letters. Each runs the real
`grpo train ... --dry-run` and must end in one message that names the key or variable, with exit
code 2 and no traceback; where the message says how to fix it, the fixed command runs."""

from __future__ import annotations

import pytest
from cli_runner import assert_user_error, run_grpo


def dry_run(*overrides: str, env: dict[str, str] | None = None):
    return run_grpo("train", "quickstart", "--dry-run", *overrides, env=env, timeout=120)




@pytest.mark.parametrize(
    "override, needles",
    [
        ("train.steps=true", ["train.steps", "valid integer", "got True", "argument train.steps=True"]),
        ("train.prompts_per_step=false", ["train.prompts_per_step", "valid integer", "got False"]),
        ("model.trust_remote_code=1", ["model.trust_remote_code", "valid boolean", "got 1"]),
        ("data.shuffle='no'", ["data.shuffle", "valid boolean", "got 'no'"]),
    ],
)
def test_a_boolean_is_no_number_and_a_number_no_boolean(override, needles):
    """`train.steps=true` ran 1 step and `model.trust_remote_code=1` trusted remote code: pydantic's
    lax mode read true as 1 and 1 (or "no") as a boolean."""
    assert_user_error(dry_run(override), *needles)


@pytest.mark.parametrize(
    "name, value, fixed",
    [
        ("GRPO_DATA__ARGS", "{num_samples: 10", '{"num_samples": 10}'),
        ("GRPO_REWARDS", '[{"name": "length"', '[{"name": "length"}]'),
        ("GRPO_MODEL__TRUST_REMOTE_CODE", "1", "true"),
    ],
)
def test_an_environment_variable_that_does_not_parse_is_named(name, value, fixed):
    """A GRPO_* value that is not JSON was "error parsing value for field 'data' from source
    EnvSettingsSource", naming no variable; "1" for a boolean was read as true."""
    assert_user_error(dry_run(env={name: value}), f"[from env {name}]", value)
    out = dry_run(env={name: fixed})
    assert out.returncode == 0, out.stderr[-2000:]


def test_env_values_are_read_like_arguments():
    """TOML values (an inline table, a boolean) work in the environment as on the command line."""
    out = dry_run(env={"GRPO_DATA__ARGS": "{num_samples = 10}", "GRPO_MODEL__TRUST_REMOTE_CODE": "true",
                       "GRPO_VLLM_API_KEY": "not-a-recipe-key"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "num_samples = 10" in out.stdout and "trust_remote_code = true" in out.stdout


@pytest.mark.parametrize(
    "override, key, suggestion, points",
    [
        ("train.st\u0435ps=3", "st\u0435ps", "steps", ["U+0435 CYRILLIC SMALL LETTER IE at position 3"]),
        ("d\u0430ta.split=train", "d\u0430ta", "data", ["U+0430 CYRILLIC SMALL LETTER A at position 2"]),
        ("train.\u0455\u0435\u0435d=1", "\u0455\u0435\u0435d", "seed",
         ["U+0455 CYRILLIC SMALL LETTER DZE at position 1", "U+0435 CYRILLIC SMALL LETTER IE at position 2"]),
    ],
)
def test_a_key_with_lookalike_letters_names_their_code_points(override, key, suggestion, points):
    """'did you mean "steps"?' for a key that prints as "steps" sends the user looking for a
    difference they cannot see; a key of look-alikes only got no suggestion at all."""
    stderr = assert_user_error(dry_run(override), f"unknown key {key!r}", f'did you mean "{suggestion}"',
                               "non-ASCII", *points)
    assert "retype it in ASCII" in stderr
