"""`grpo new`: a generated plugin project installs, is listed, and trains through grpo (its own tests
run in the test environment); a generated recipe loads to the same values as the recipe it came from
and explains every key of the schema."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from cli_runner import assert_clean_error, install_plugin

from grpocli.recipe.catalog import builtin
from grpocli.recipe.fields import describe
from grpocli.recipe.loader import load_recipe


@pytest.mark.parametrize("name", sorted(builtin()))
def test_a_new_recipe_loads_to_its_sources_values_and_explains_every_key(grpo, tmp_path, name):
    out = grpo("new", "recipe", "--from", name, "-o", str(tmp_path / "r.toml"))
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "r.toml").read_text()
    assert load_recipe(str(tmp_path / "r.toml")).recipe == load_recipe(name).recipe
    for row in describe():
        key = row["key"].split("[].")[-1].split(".")[-1]
        assert key in text, row["key"]
    assert text.count("# ") > len(describe())  # a comment line per key at least


def test_new_recipe_keeps_an_existing_file(grpo, tmp_path):
    mine = tmp_path / "r.toml"
    mine.write_text("# mine\n")
    assert_clean_error(grpo("new", "recipe", "-o", str(mine)), "exists", "--force")
    assert mine.read_text() == "# mine\n"
    assert_clean_error(grpo("new", "recipe", "--from", "no_such_recipe", "-o", str(tmp_path / "x.toml")), "no_such_recipe")


@pytest.mark.parametrize("name", ["Grpo_Bad", "grpo--x", "1grpo", "grpo-class"])
def test_a_plugin_name_grpo_cannot_write_is_refused(grpo, tmp_path, name):
    out = grpo("new", "plugin", name, "-o", str(tmp_path))
    assert_clean_error(out, "grpo new plugin", "valid:")
    assert not any(tmp_path.iterdir())


def test_a_new_plugin_does_not_overwrite_a_folder(grpo, tmp_path):
    (tmp_path / "grpo-demo").mkdir()
    (tmp_path / "grpo-demo" / "mine.txt").write_text("keep")
    assert_clean_error(grpo("new", "plugin", "grpo-demo", "-o", str(tmp_path)), "not empty")
    assert [p.name for p in (tmp_path / "grpo-demo").iterdir()] == ["mine.txt"]


@pytest.mark.slow
def test_a_new_plugin_installs_is_listed_and_trains_through_its_own_tests(grpo, tmp_path):
    out = grpo("new", "plugin", "grpo-demo", "-o", str(tmp_path))
    assert out.returncode == 0 and "pip install -e" in out.stdout, out.stderr
    project = tmp_path / "grpo-demo"
    site = install_plugin(project, tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1"}
    listed = grpo("inspect", "plugins", env=env)
    assert listed.returncode == 0 and "demo.exact" in listed.stdout and "grpo-demo" in listed.stdout, listed.stderr
    # the generated project's own tests: its reward, `grpo inspect plugins`, one training step
    own = subprocess.run(check=False, args=[sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(project / "tests")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert own.returncode == 0 and "3 passed" in own.stdout, own.stdout[-3000:] + own.stderr[-3000:]
