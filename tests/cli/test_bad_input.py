"""Bad input: one clear message (where, what is valid, what next), exit code 2, no traceback."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from cli_runner import assert_clean_error


def make_plugin_dist(root: Path, dist: str, module: str, code: str) -> dict[str, str]:
    """A real installed distribution (dist-info + module) on a PYTHONPATH entry."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(textwrap.dedent(code))
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[grpo]\n{module} = {module}\n")
    return {"PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_malformed_toml_names_the_file_and_line(grpo, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nsteps = = 3\n")
    out = grpo("train", str(bad))
    assert_clean_error(out, str(bad), "line 2", "next:")


def test_unknown_key_gets_did_you_mean_and_valid_keys(grpo, tmp_path):
    bad = tmp_path / "typo.toml"
    bad.write_text("[train]\nlearning_rat = 1e-5\n")
    out = grpo("train", str(bad))
    assert_clean_error(out, str(bad), "train.learning_rat", 'did you mean "learning_rate"', "valid:")


@pytest.mark.parametrize(
    "override, needles",
    [
        ("train.steps=many", ["train.steps", "valid integer", "argument train.steps"]),
        ("generation.num_generations=1", ["generation.num_generations", "greater than or equal to 2"]),
        ("algorithm.loss=ppo", ["algorithm.loss", "'grpo'", "'dapo'"]),
    ],
)
def test_wrong_type_or_range(grpo, override, needles):
    assert_clean_error(grpo("train", "quickstart", override), *needles)


def test_unknown_recipe_name(grpo):
    assert_clean_error(grpo("train", "quikstart"), 'did you mean "quickstart"', "grpo inspect recipes")


def test_unknown_reward(grpo):
    out = grpo("train", "quickstart", 'rewards=[{name="lenght"}]', "--dry-run")
    assert_clean_error(out, "rewards[0].name", 'did you mean "length"', "grpo inspect plugins")


def test_misspelt_arg_of_a_builtin_reward(grpo):
    out = grpo("train", "quickstart", 'rewards=[{name="length", args={targt=8}}]', "--dry-run")
    assert_clean_error(out, "rewards[0].args.targt", "reward 'length' takes no argument 'targt'",
                       'did you mean "target"', "valid: normalize, target, target_length")


def test_arg_of_a_kwargs_reward_must_be_declared(grpo, tmp_path):
    env = make_plugin_dist(tmp_path / "site", "grpo-kw", "grpo_kw_plugin", """
        import grpocli

        def loose(prompts, completions, **kwargs):
            return [float(kwargs.get("scale", 1))] * len(completions)

        @grpocli.recipe_args("scale")
        def declared(prompts, completions, **kwargs):
            return [float(kwargs.get("scale", 1))] * len(completions)

        @grpocli.hookimpl
        def register_rewards(register):
            register("test.loose", loose)
            register("test.declared", declared)
    """)
    out = grpo("train", "quickstart", 'rewards=[{name="test.loose", args={scale=2}}]', "--dry-run", env=env)
    assert_clean_error(out, "rewards[0].args.scale", "reward 'test.loose' takes no argument 'scale'",
                       "valid: (this reward takes no args)", "@grpocli.recipe_args")
    out = grpo("train", "quickstart", 'rewards=[{name="test.declared", args={scael=2}}]', "--dry-run", env=env)
    assert_clean_error(out, "rewards[0].args.scael", "'test.declared'", "valid: scale")
    ok = grpo("train", "quickstart", 'rewards=[{name="test.declared", args={scale=2}}]', "--dry-run", env=env)
    assert ok.returncode == 0, ok.stderr


def test_unknown_dataset(grpo):
    out = grpo("train", "quickstart", "data.dataset=countdwn", "--dry-run")
    assert_clean_error(out, "data.dataset", 'did you mean "countdown"', "grpo inspect plugins")


def test_gdpo_advantages_refuse_gated_rewards(grpo):
    out = grpo("train", "quickstart", "algorithm.advantage_scale=normalize_then_sum",
               "algorithm.reward_combination=gated",
               'rewards=[{name="length", gate=true}, {name="length", args={target=2}}]', "--dry-run")
    assert_clean_error(out, "algorithm.advantage_scale", "gating is not a weighted sum",
                       "valid: normalize_then_sum with reward_combination = 'sum'",
                       'algorithm.reward_combination = "sum"')


@pytest.mark.parametrize(("overrides", "key", "says"), [
    (["algorithm.loss=vespo", "algorithm.importance_sampling_level=sequence"],
     "algorithm.importance_sampling_level", "computes its own sequence-level weight"),
    (["algorithm.loss=cispo", "algorithm.clip_ratio_c=3.0"], "algorithm.clip_ratio_c", "does not use"),
    (["algorithm.loss=vespo", "generation.backend=vllm", "vllm.importance_sampling_mode=sequence_mask"],
     "vllm.importance_sampling_mode", "needs a token-level correction"),
    (["algorithm.beta=0.1", "algorithm.kl_estimator=full"], "algorithm.kl_estimator", "NotImplementedError"),
], ids=["vespo-sequence", "cispo-dual-clip", "vespo-sequence-engine-weights", "full-kl"])
def test_loss_settings_that_make_no_sense_together(grpo, overrides, key, says):
    """Refused before any model loads, with what is valid and what to set."""
    out = grpo("train", "quickstart", *overrides, "--dry-run")
    assert_clean_error(out, key, says, "valid:", "next:")


def test_a_sequence_ratio_with_a_token_summing_loss_runs_with_a_note(grpo):
    """TRL 1.16 warns and trains this setting; so does grpo, naming what it computes and the GSPO loss."""
    out = grpo("train", "quickstart", "algorithm.loss=dapo", "algorithm.importance_sampling_level=sequence",
               "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "note: algorithm.importance_sampling_level = 'sequence' with loss = 'dapo'" in out.stderr
    assert 'algorithm.loss = "grpo"' in out.stderr


def test_plugin_that_fails_to_import(grpo, tmp_path):
    env = make_plugin_dist(tmp_path / "site", "grpo-broken", "grpo_broken_plugin",
                           "import no_such_module_anywhere\n")
    out = grpo("inspect", "plugins", env=env)
    assert_clean_error(out, "grpo_broken_plugin", "grpo-broken", "ModuleNotFoundError",
                       "GRPO_DISABLE_PLUGIN_AUTOLOAD")
    # ... and the advertised way around it works
    ok = grpo("inspect", "plugins", env={**env, "GRPO_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert ok.returncode == 0 and "grpo-broken" not in ok.stdout


def test_duplicate_reward_name_names_both_plugins(grpo, tmp_path):
    env = make_plugin_dist(tmp_path / "site", "grpo-dupe", "grpo_dupe_plugin", """
        import grpocli

        @grpocli.hookimpl
        def register_rewards(register):
            register("length", lambda prompts, completions, **kw: [0.0] * len(completions))
    """)
    out = grpo("inspect", "plugins", env=env)
    assert_clean_error(out, "'length'", "registered twice", "grpocli.rewards.builtin", "grpo_dupe_plugin")


def test_reward_that_returns_the_wrong_number_of_values(grpo, tmp_path):
    env = make_plugin_dist(tmp_path / "site", "grpo-short", "grpo_short_plugin", """
        import grpocli

        def short(prompts, completions, **kwargs):
            return [1.0]

        @grpocli.hookimpl
        def register_rewards(register):
            register("test.short", short)
    """)
    out = grpo("train", "quickstart", 'rewards=[{name="test.short"}]', "train.steps=1",
               f"train.output_dir={tmp_path / 'run'}", "log.progress=none", env=env)
    assert_clean_error(out, "test.short", "1", "valid:")


def test_plugin_selection_by_environment(grpo, tmp_path):
    env = make_plugin_dist(tmp_path / "site", "grpo-extra", "grpo_extra_plugin", """
        import grpocli

        @grpocli.hookimpl
        def register_datasets(register):
            register("extra.data", lambda split, seed: [{"prompt": "x"}])
    """)
    assert "extra.data" in grpo("inspect", "plugins", env=env).stdout
    off = grpo("inspect", "plugins", env={**env, "GRPO_PLUGINS": ""})
    assert off.returncode == 0 and "extra.data" not in off.stdout
    on = grpo("inspect", "plugins", env={**env, "GRPO_PLUGINS": "grpo-extra"})
    assert "extra.data" in on.stdout
    missing = grpo("inspect", "plugins", env={**env, "GRPO_PLUGINS": "nope"})
    assert_clean_error(missing, "GRPO_PLUGINS", "nope")


def test_dry_run_refuses_an_ambiguous_gguf_folder(grpo, tmp_path):
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    out = grpo("train", "quickstart", f'model.name_or_path="{tmp_path}"', "--dry-run")
    assert_clean_error(out, "2 GGUF files (a.gguf, b.gguf)")
