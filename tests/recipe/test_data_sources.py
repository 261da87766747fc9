"""``[[data.sources]]`` in a recipe (grpocli.recipe.data_sources): declared once, with bounds and
descriptions; what the recipe alone can show wrong is refused as it loads, naming the source."""

from __future__ import annotations

import pytest
import tomllib

from grpocli.errors import UserError
from grpocli.recipe import load_recipe, to_toml
from grpocli.recipe.data_sources import DataSource, default_name, reward_indices, unknown_rewards
from grpocli.recipe.fields import describe

MIX = """
[data]
split = "train"
prompt_column = "question"

[[data.sources]]
dataset = "arithmetic"
weight = 3
args = { num_samples = 20 }
prompt_column = "prompt"
rewards = ["arithmetic.exact"]

[[data.sources]]
name = "cd"
dataset = "countdown"
eval_split = "validation"

[[rewards]]
name = "arithmetic.exact"
[[rewards]]
name = "countdown.equation"
"""


def _recipe(tmp_path, text: str = MIX, *overrides: str):
    path = tmp_path / "mix.toml"
    path.write_text(text)
    return load_recipe(str(path), list(overrides)).recipe


def test_sources_load_with_their_defaults_and_round_trip(tmp_path):
    r = _recipe(tmp_path)
    first, second = r.data.sources
    assert (first.label, first.weight, second.label, second.rewards) == ("arithmetic", 3.0, "cd", None)
    own = first.section(r.data)  # the source alone, as the single-dataset code paths take it
    assert (own.dataset, own.args, own.prompt_column, own.split, own.sources) == (
        "arithmetic", {"num_samples": 20}, "prompt", "train", [])
    assert second.section(r.data).prompt_column == "question" and second.section(r.data).eval_split == "validation"
    again = tmp_path / "again.toml"
    again.write_text(to_toml(r))  # config.resolved.toml reads back the same
    assert load_recipe(str(again)).recipe.data.sources == r.data.sources
    assert tomllib.loads(to_toml(r))["data"]["sources"][1]["name"] == "cd"


@pytest.mark.parametrize("weight", ["0", "-1", "nan", "inf", "2e6"])
def test_a_weight_out_of_bounds_names_the_source(tmp_path, weight):
    with pytest.raises(UserError) as err:
        _recipe(tmp_path, MIX.replace('eval_split = "validation"', f"weight = {weight}"))
    text = str(err.value)
    assert 'data.sources[1] ("cd"): weight = ' in text and "valid: a number > 0" in text, text


def test_a_name_twice_or_unfit_for_metric_keys_is_refused(tmp_path):
    with pytest.raises(UserError, match=r'data.sources\[1\] \("arithmetic"\): the name is data.sources\[0\]'):
        _recipe(tmp_path, MIX.replace('name = "cd"\ndataset = "countdown"', 'dataset = "arithmetic"'))
    with pytest.raises(UserError, match=r"name 'c/d' holds other characters"):
        _recipe(tmp_path, MIX.replace('name = "cd"', 'name = "c/d"'))
    with pytest.raises(UserError, match=r'data.sources\[1\] \("cd"\): rewards = \[\] would score every row of it 0'):
        _recipe(tmp_path, MIX.replace('name = "cd"', 'name = "cd"\nrewards = []'))
    with pytest.raises(UserError, match=r"data.sources\[0\].dataset"):  # required: pydantic names the key
        _recipe(tmp_path, MIX.replace('dataset = "arithmetic"\n', ""))


def test_default_names_come_from_the_dataset():
    assert [default_name(d) for d in ("gsm8k", "data/math.jsonl", "data/{split}.jsonl", "openai/gsm8k",
                                      "verifiers:wordle", "a b.csv")] == ["gsm8k", "math", "data", "gsm8k", "wordle",
                                                                          "a_b"]


def test_rewards_are_chosen_by_name_or_label():
    source = DataSource(dataset="x", rewards=["length", "judge#2"])
    names, labels = ["length", "judge", "judge", "format.soft"], ["length", "judge", "judge#2", "format.soft"]
    assert reward_indices(source, names, labels) == [0, 2]
    assert reward_indices(DataSource(dataset="x"), names, labels) == [0, 1, 2, 3]
    assert unknown_rewards(DataSource(dataset="x", rewards=["lenght"]), names, labels) == ["lenght"]


def test_the_keys_are_documented_with_their_bounds():
    rows = {row["key"]: row for row in describe()}
    assert "(>0, <=1000000.0)" in rows["data.sources[].weight"]["type"]
    for key in ("name", "dataset", "weight", "split", "eval_split", "args", "rewards", "prompt_column", "template",
                "system_prompt"):
        assert rows[f"data.sources[].{key}"]["description"], key
