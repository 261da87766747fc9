"""TRL's GRPOConfig names and the recipe keys they map to (docs/coming-from-trl.md and the generated
docs/reference/trl-fields.md)."""

from __future__ import annotations

import dataclasses

import pytest
from cli_runner import run_grpo

from grpocli.recipe.fields import describe
from grpocli.recipe.trl_names import TRL_FIELDS, lookup


def test_every_mapped_key_is_a_recipe_key():
    keys = {row["key"] for row in describe()}
    assert {key for key, _ in TRL_FIELDS.values() if key} <= keys
    assert all(note for key, note in TRL_FIELDS.values() if key is None)  # unsupported ones say why


def test_every_grpoconfig_field_of_trl_is_listed():
    trl = pytest.importorskip("trl", reason="TRL is not installed (pip install 'grpocli[bench]')")
    from transformers import TrainingArguments

    base = {f.name for f in dataclasses.fields(TrainingArguments)}
    own = {f.name for f in dataclasses.fields(trl.GRPOConfig)} - base
    assert own <= set(TRL_FIELDS), sorted(own - set(TRL_FIELDS))


def test_lookup_puts_the_exact_name_first():
    assert list(lookup("beta"))[0] == "beta"
    assert lookup("use_bias_correction_kl") == {"use_bias_correction_kl": TRL_FIELDS["use_bias_correction_kl"]}


def test_inspect_fields_by_trl_name():
    out = run_grpo("inspect", "fields", "--trl", "use_bias_correction_kl", env={"COLUMNS": "250"})
    assert out.returncode == 0, out.stderr
    assert "algorithm.kl_importance_correction" in out.stdout and "TRL's default true" in out.stdout
    bad = run_grpo("inspect", "fields", "--trl", "no_such_trl_field")
    assert bad.returncode == 2 and "--trl" in bad.stderr and "Traceback" not in bad.stderr


def test_the_docs_table_is_the_mapping():
    """The docs' generated TRL page lists every entry of TRL_FIELDS with its key, and the
    "Coming from TRL" page links it."""
    from cli_runner import ROOT
    from test_docs import hook

    page = hook().trl_fields()
    for name, (key, _) in TRL_FIELDS.items():
        row = f"| `{name}` | {'`' + key + '`' if key else 'not supported'} |"
        assert row in page, row
    assert "reference/trl-fields.md" in (ROOT / "docs" / "coming-from-trl.md").read_text()
