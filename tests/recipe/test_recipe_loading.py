"""Recipes: every shipped recipe validates; precedence defaults < file < env < arguments."""

from __future__ import annotations

import pytest

from grpocli.errors import UserError
from grpocli.recipe import catalog, flatten, load_recipe, parse_overrides, to_toml
from grpocli.recipe.schema import Recipe


@pytest.mark.parametrize("name", sorted(catalog.builtin()))
def test_every_shipped_recipe_validates_and_documents_itself(name):
    path = catalog.builtin()[name]
    resolved = load_recipe(str(path))
    assert resolved.name == name
    header = [line for line in path.read_text().splitlines() if line.startswith("#")]
    text = "\n".join(header).lower()
    assert "hardware" in text and "time" in text and "grpo train" in text, f"{path} header"


def test_quickstart_is_found_by_name():
    assert catalog.find("quickstart").name == "quickstart.toml"


def test_precedence_defaults_file_env_arguments(tmp_path, monkeypatch):
    recipe = tmp_path / "r.toml"
    recipe.write_text("[train]\nsteps = 10\nlearning_rate = 0.5\nseed = 3\n[generation]\nnum_generations = 4\n")
    monkeypatch.setenv("GRPO_TRAIN__STEPS", "20")
    monkeypatch.setenv("GRPO_TRAIN__SEED", "4")
    resolved = load_recipe(str(recipe), ["train.steps=30"])
    r = resolved.recipe
    assert r.train.steps == 30 and resolved.source_of("train.steps") == "argument train.steps=30"
    assert r.train.seed == 4 and resolved.source_of("train.seed") == "env GRPO_TRAIN__SEED"
    assert r.train.learning_rate == 0.5 and resolved.source_of("train.learning_rate") == f"file {recipe}"
    assert r.train.micro_batch_size == Recipe().train.micro_batch_size
    assert resolved.source_of("train.micro_batch_size") == "default"
    assert r.generation.num_generations == 4


def test_overrides_parse_toml_values_and_bare_words():
    assert parse_overrides(["a.b=3", "a.c=true", "d.e=hello", 'f.g={x=1}', "h.i=[1, 2]"]) == {
        "a": {"b": 3, "c": True}, "d": {"e": "hello"}, "f": {"g": {"x": 1}}, "h": {"i": [1, 2]},
    }
    with pytest.raises(UserError, match="section.key=value"):
        parse_overrides(["train.steps"])


def test_resolved_recipe_round_trips_through_toml(tmp_path):
    resolved = load_recipe("quickstart", ["train.steps=7"])
    out = tmp_path / "config.resolved.toml"
    out.write_text(to_toml(resolved.recipe))
    again = load_recipe(str(out))
    assert flatten(again.recipe) == flatten(resolved.recipe)


def test_verl_loss_names_are_accepted():
    assert load_recipe(None, ["algorithm.loss=token-mean"]).recipe.algorithm.loss == "dapo"
    assert load_recipe(None, ["algorithm.loss=seq-mean-token-mean"]).recipe.algorithm.loss == "grpo"
    assert load_recipe(None, ["algorithm.loss=seq-mean-token-sum-norm"]).recipe.algorithm.loss == "dr_grpo"


def test_batch_layout_that_cannot_work_is_refused_with_valid_values():
    with pytest.raises(UserError, match="multiples of 2"):
        load_recipe(None, ["train.prompts_per_step=3", "train.num_processes=2"])
    with pytest.raises(UserError, match="greater than or equal to 2"):
        load_recipe(None, ["generation.num_generations=1"])


def test_a_cross_field_error_names_its_keys_and_values_not_the_whole_recipe():
    with pytest.raises(UserError) as err:
        load_recipe("quickstart", ["train.prompts_per_step=3", "train.num_processes=2"])
    line = err.value.what.splitlines()[1]
    assert "train.prompts_per_step = 3" in line and "train.num_processes = 2" in line
    assert "got {" not in line and "'model'" not in line and "Value error" not in line, line
    assert len(line) < 250, line
    with pytest.raises(UserError) as err:  # a section's own cross-field check
        load_recipe(None, ["vllm.importance_sampling_clip_min=3", "vllm.importance_sampling_clip_max=2"])
    assert "importance_sampling_clip_min (3.0)" in err.value.what and "got {" not in err.value.what
    with pytest.raises(UserError, match=r"\(got -1\)"):  # one key's value is still quoted
        load_recipe(None, ["train.learning_rate=-1"])


def test_every_key_is_documented_once_in_the_schema():
    from grpocli.recipe.fields import describe

    rows = describe()
    keys = [r["key"] for r in rows]
    assert len(keys) == len(set(keys)) > 60
    assert "rewards[].weight" in keys and "algorithm.loss" in keys
    undocumented = [r["key"] for r in rows if not r["description"]]
    assert undocumented == []
    by_key = {r["key"]: r for r in rows}
    assert ">=2" in by_key["generation.num_generations"]["type"]


def test_inspect_fields_and_recipe_show_sources(grpo):
    out = grpo("inspect", "recipe", "quickstart", "train.steps=3", env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "argument train.steps=3" in out.stdout and "default" in out.stdout
    fields = grpo("inspect", "fields", "algorithm", env={"COLUMNS": "200"})
    assert fields.returncode == 0 and "epsilon_high" in fields.stdout


def test_recipe_file_bytes_empty_files_and_output_dir(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_bytes(b"\xef\xbb\xbf[train]\nsteps = 3\n")  # a BOM, as Windows editors write
    assert load_recipe(str(recipe)).recipe.train.steps == 3
    recipe.write_bytes(b"[train]\n\n# na\xefve\xff\n")
    with pytest.raises(UserError) as err:
        load_recipe(str(recipe))
    assert err.value.where == f"{recipe}:3" and "byte 0xef at offset 13 (line 3, column 5)" in err.value.what
    for text in ("", "\n# only a comment\n"):
        recipe.write_text(text)
        with pytest.raises(UserError, match="sets nothing"):
            load_recipe(str(recipe))
    recipe.write_text("[train]\n")
    assert load_recipe(str(recipe)).recipe.train.steps == Recipe().train.steps
    for value in ("''", "'  '"):
        with pytest.raises(UserError, match="output_dir is empty"):
            load_recipe("quickstart", [f"train.output_dir={value}"])


def test_each_key_of_a_section_the_file_lacks_keeps_its_own_source():
    import json

    from grpocli.recipe import sources_json

    resolved = load_recipe("quickstart", ["eval.every=3", "eval.n=2", "model.tiny.num_layers=1"])
    assert resolved.source_of("eval.every") == "argument eval.every=3"
    assert resolved.source_of("model.tiny.num_layers") == "argument model.tiny.num_layers=1"
    assert resolved.source_of("eval.k") == "default"
    ran = resolved.recipe.model_copy(update={"train": resolved.recipe.train.model_copy(update={"num_processes": 2})})
    sources = json.loads(sources_json(resolved, ran))  # what <run>/config.sources.json holds
    assert sources["eval.n"] == "argument eval.n=2" and "train.seed" not in sources  # not listed: default
    assert sources["train.learning_rate"].startswith("file ")
    assert sources["train.num_processes"] == "set when the run started"
