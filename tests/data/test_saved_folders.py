"""data.dataset naming a folder written by `datasets`' save_to_disk (Dataset: one split;
DatasetDict: the split data.split names), real folders written by `datasets`; a folder that is
neither, nor a directory of data files, is refused naming what it holds."""

from __future__ import annotations

import pytest
from cli_runner import run_grpo
from tiny_runs import TINY_MODEL

from grpocli.data.source import load_dataset_for
from grpocli.errors import UserError
from grpocli.recipe.schema import DataSection

ROWS = [{"prompt": f"{a}+{b}=", "answer": a + b} for a in range(4) for b in range(4)]


@pytest.fixture
def saved(tmp_path):
    import datasets

    train = datasets.Dataset.from_list(ROWS)
    train.save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict(train=train, test=train.select(range(3))).save_to_disk(str(tmp_path / "dict"))
    return tmp_path


def test_a_dataset_and_a_dataset_dict_folder_load_by_split(saved, registry):
    one = load_dataset_for(DataSection(dataset=str(saved / "one")), registry, split="train", seed=0)
    assert one["prompt"] == [r["prompt"] for r in ROWS] and one["answer"][-1] == 6
    data = DataSection(dataset=str(saved / "dict"), split="test", eval_split="train")
    assert len(load_dataset_for(data, registry, split="test", seed=0)) == 3
    assert len(load_dataset_for(data, registry, split="train", seed=0)) == len(ROWS)
    with pytest.raises(UserError, match=r"DatasetDict folder .* has no split 'validation': it holds train, test"):
        load_dataset_for(DataSection(dataset=str(saved / "dict")), registry, split="validation", seed=0)
    with pytest.raises(UserError, match=r"'test' was asked of .*, a Dataset.save_to_disk folder that holds split"):
        load_dataset_for(DataSection(dataset=str(saved / "one")), registry, split="test", seed=0)
    with pytest.raises(UserError, match=r"data.args has num_samples, but .* is a DatasetDict.save_to_disk folder"):
        load_dataset_for(DataSection(dataset=str(saved / "dict"), args={"num_samples": 3}), registry, "train", 0)


def test_a_folder_that_is_neither_is_named_with_what_it_holds(saved, registry):
    other = saved / "other"
    other.mkdir()
    (other / "notes.txt").write_text("hi")
    (other / "weights.bin").write_bytes(b"\0")
    with pytest.raises(UserError) as info:
        load_dataset_for(DataSection(dataset=str(other)), registry, split="train", seed=0)
    text = str(info.value)
    assert "holds no data files: notes.txt, weights.bin (2 file(s): 1 .txt, 1 .bin)" in text, text
    assert "Dataset.save_to_disk" in text and "DatasetDict.save_to_disk" in text and ".jsonl" in text, text
    (saved / "one" / "data-00000-of-00001.arrow").unlink()  # a copy that left the data out
    with pytest.raises(UserError, match=r"looks like a Dataset.save_to_disk folder \(state.json\) but .* could not"):
        load_dataset_for(DataSection(dataset=str(saved / "one")), registry, split="train", seed=0)


def test_grpo_train_dry_run_reads_a_dataset_dict_folder(saved):
    done = run_grpo("train", "quickstart", "--dry-run", *TINY_MODEL, f"data.dataset='{saved / 'dict'}'",
                    "data.args={}", "data.split=test", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
