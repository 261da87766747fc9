"""Resolving data.dataset: registered names, local files (jsonl/csv/parquet), errors users can act on."""

from __future__ import annotations

import csv
import json

import pytest

from grpocli.data.source import load_dataset_for, resolve
from grpocli.errors import UserError
from grpocli.recipe.schema import DataSection
from grpocli.registry.names import Registry

ROWS = [{"prompt": "1+2=", "answer": 3}, {"prompt": "5-1=", "answer": 4}]


def _write(path, rows=ROWS):
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".csv":
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif path.suffix == ".parquet":
        import datasets

        datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


def test_registered_name_gets_its_args(registry):
    data = DataSection(dataset="arithmetic", args={"num_samples": 7, "ops": "*"})
    ds = load_dataset_for(data, registry, split="train", seed=0)
    assert len(ds) == 7 and set(ds.column_names) == {"prompt", "answer"}
    assert all("*" in p for p in ds["prompt"])


def test_countdown_columns(registry):
    ds = load_dataset_for(DataSection(dataset="countdown", args={"num_samples": 4}), registry, "train", 0)
    assert set(ds.column_names) == {"prompt", "nums", "target", "solution"}
    assert isinstance(ds[0]["nums"], list) and isinstance(ds[0]["target"], int)


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_local_files_by_suffix(tmp_path, registry, suffix):
    path = _write(tmp_path / f"train{suffix}")
    ds = load_dataset_for(DataSection(dataset=str(path)), registry, "train", 0)
    assert ds.to_list() == ROWS


def test_split_placeholder_and_directories(tmp_path, registry):
    _write(tmp_path / "d" / "train.jsonl")
    _write(tmp_path / "d" / "test.jsonl", [{"prompt": "held", "answer": 0}])
    by_name = DataSection(dataset=str(tmp_path / "d" / "{split}.jsonl"), eval_split="test")
    assert load_dataset_for(by_name, registry, "test", 0)["prompt"] == ["held"]
    directory = DataSection(dataset=str(tmp_path / "d"), eval_split="test")
    assert load_dataset_for(directory, registry, "train", 0).to_list() == ROWS
    assert load_dataset_for(directory, registry, "test", 0)["prompt"] == ["held"]


def test_missing_file_names_the_path_and_what_is_nearby(tmp_path, registry):
    _write(tmp_path / "train.jsonl")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UserError) as err:
        load_dataset_for(DataSection(dataset=str(tmp_path / "trian.jsonl")), registry, "train", 0)
    assert "trian.jsonl" in err.value.what and err.value.where == "data.dataset"
    assert err.value.valid.startswith(f"in {tmp_path}/: train.jsonl")  # data files first
    assert "notes.txt" in err.value.valid


def test_single_file_refuses_another_split(tmp_path, registry):
    path = _write(tmp_path / "train.jsonl")
    data = DataSection(dataset=str(path), eval_split="test")
    with pytest.raises(UserError) as err:
        load_dataset_for(data, registry, "test", 0)
    assert err.value.where == "data.eval_split" and "{split}" in err.value.valid


def test_unknown_name_gets_did_you_mean(registry):
    with pytest.raises(UserError) as err:
        load_dataset_for(DataSection(dataset="arithmatic"), registry, "train", 0)
    assert 'did you mean "arithmetic"' in err.value.what
    assert err.value.where == "data.dataset"
    assert "countdown" in err.value.valid and "hub id" in err.value.valid


def test_resolution_order(registry, tmp_path):
    assert resolve(DataSection(dataset="gsm8k"), registry)[0].name == "gsm8k"
    entry, args = resolve(DataSection(dataset="data/x.csv"), registry)
    assert (entry.name, args) == ("local", {"path": "data/x.csv"})
    entry, args = resolve(DataSection(dataset="openai/gsm8k", args={"name": "main"}), registry)
    assert (entry.name, args) == ("hub", {"id": "openai/gsm8k", "name": "main"})
    (tmp_path / "dir").mkdir()
    assert resolve(DataSection(dataset=str(tmp_path / "dir")), registry)[0].name == "local"


def test_unknown_and_missing_args_are_named_before_loading(registry):
    with pytest.raises(UserError) as err:
        load_dataset_for(DataSection(dataset="arithmetic", args={"num_sample": 3}), registry, "train", 0)
    assert err.value.where == "data.args" and "'num_sample'" in err.value.what
    assert "num_samples" in err.value.valid
    with pytest.raises(UserError, match="needs data.args.id"):
        load_dataset_for(DataSection(dataset="hub"), registry, "train", 0)
    with pytest.raises(UserError, match="may not set seed"):
        load_dataset_for(DataSection(dataset="arithmetic", args={"seed": 1}), registry, "train", 0)


def _plugin_registry(loader) -> Registry:
    reg = Registry("dataset")
    reg.registrar("acme", "acme-datasets")("acme.puzzles", loader)
    return reg


def test_loader_exception_names_dataset_and_plugin():
    def broken(split, seed):
        raise KeyError("col")

    with pytest.raises(UserError) as err:
        load_dataset_for(DataSection(dataset="acme.puzzles"), _plugin_registry(broken), "train", 0)
    assert "'acme.puzzles' failed to load split 'train': KeyError" in err.value.what
    assert "plugin acme, acme-datasets" in err.value.where


def test_loader_may_return_rows_but_not_anything():
    rows = _plugin_registry(lambda split, seed: [{"prompt": split, "n": seed}])
    assert load_dataset_for(DataSection(dataset="acme.puzzles"), rows, "dev", 4).to_list() == [
        {"prompt": "dev", "n": 4}
    ]
    data = DataSection(dataset="acme.puzzles")
    with pytest.raises(UserError, match="returned str") as err:
        load_dataset_for(data, _plugin_registry(lambda split, seed: "x"), "train", 0)
    assert err.value.where == "plugin acme (acme-datasets)"
    with pytest.raises(UserError, match="no rows"):
        load_dataset_for(data, _plugin_registry(lambda split, seed: []), "train", 0)


def test_a_loader_whose_rows_mix_types_is_named(registry):
    """A list of rows with an int in one row and a str in another: arrow's ArrowInvalid traceback."""

    def mixed(split, seed):
        return [{"prompt": "1+1=", "answer": 2}, {"prompt": "2+2=", "answer": "four"}]

    registry.registrar("my_plugin", "my-dist")("mixed", mixed)
    with pytest.raises(UserError) as err:
        load_dataset_for(DataSection(dataset="mixed"), registry, "train", 0)
    assert "column 'answer' holds int (2) on row 0 and str ('four') on row 1" in str(err.value)
    assert "loader 'mixed' from plugin my_plugin" in str(err.value)
