"""Folders written by `datasets`' ``save_to_disk``, read as saved with ``datasets.load_from_disk``.

``Dataset.save_to_disk(path)`` writes one split: ``state.json``, ``dataset_info.json`` and
``data-*.arrow``; like a single file, it is the split ``data.split`` names.
``DatasetDict.save_to_disk(path)`` writes ``dataset_dict.json`` and a folder per split
(``train/``, ``test/``): ``data.split`` (and ``data.eval_split``) choose among them.
A directory that is neither and holds no data files is refused naming what it does hold.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from grpocli.errors import UserError

if TYPE_CHECKING:
    import datasets

DICT_MARK = "dataset_dict.json"  # DatasetDict.save_to_disk
DATASET_MARK = "state.json"  # Dataset.save_to_disk (beside dataset_info.json and data-*.arrow)
SHOWN = 10
VALID = ("a folder written by Dataset.save_to_disk (state.json, dataset_info.json, data-*.arrow) or by "
         "DatasetDict.save_to_disk (dataset_dict.json and a folder per split), or a directory of .jsonl, .json, "
         ".parquet or .csv files named by split (train.jsonl, test.jsonl)")

Kind = Literal["Dataset", "DatasetDict"]


def saved_kind(directory: Path) -> Kind | None:
    """Which save_to_disk wrote ``directory``, if one did."""
    if (directory / DICT_MARK).is_file():
        return "DatasetDict"
    if (directory / DATASET_MARK).is_file():
        return "Dataset"
    return None


def load_saved(directory: Path, kind: Kind, split: str, load_args: dict[str, Any]) -> datasets.Dataset:
    """Split ``split`` of a save_to_disk folder (a Dataset folder is its one split)."""
    import datasets

    if load_args:
        raise UserError(
            f"data.args has {', '.join(sorted(load_args))}, but {str(directory)!r} is a {kind}.save_to_disk folder, "
            "read as it was saved (datasets.load_from_disk takes no reader options)",
            where="data.args",
            valid="no data.args for a save_to_disk folder",
            hint="remove data.args (data.args = {} on the command line)",
        )
    try:
        loaded = datasets.load_from_disk(str(directory))
    except Exception as exc:  # noqa: BLE001 - whatever the folder's defect, named with the folder
        raise UserError(
            f"{str(directory)!r} looks like a {kind}.save_to_disk folder ({DICT_MARK if kind == 'DatasetDict' else DATASET_MARK}"
            f") but datasets.load_from_disk could not read it: {type(exc).__name__}: {exc}; it holds {contents(directory)}",
            where="data.dataset",
            valid=VALID,
            hint=f"write it again with {kind}.save_to_disk(path), whole (a copy may have left files out)",
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise UserError(
                f"the DatasetDict folder {str(directory)!r} has no split {split!r}: it holds {', '.join(loaded) or 'none'}",
                where="data.split" if split == "train" else "data.split / data.eval_split",
                valid=", ".join(loaded),
                hint="set data.split (and data.eval_split) to one of its splits",
            )
        return loaded[split]
    return loaded


def check_has_data(directory: Path, data_files: list[Path]) -> None:
    """UserError for a directory without data files (``data_files``) that no save_to_disk wrote either."""
    if data_files:
        return
    raise UserError(
        f"the data directory {str(directory)!r} holds no data files: {contents(directory)}",
        where="data.dataset",
        valid=VALID,
        hint="name a data file or folder; a Hub dataset is saved here with "
        "datasets.load_dataset(ID).save_to_disk(PATH) (or .to_json('data/train.jsonl'))",
    )


def contents(directory: Path) -> str:
    """What a directory holds, in words: its first entries and the count of each file type."""
    try:
        entries = sorted(p for p in directory.rglob("*") if not any(part.startswith(".")
                                                                     for part in p.relative_to(directory).parts))
    except OSError as exc:
        return f"(cannot list it: {exc})"
    files = [p for p in entries if p.is_file()]
    if not entries:
        return "nothing (it is empty)"
    names = [str(p.relative_to(directory)) + ("/" if p.is_dir() else "") for p in entries[:SHOWN]]
    more = f" and {len(entries) - SHOWN} more" if len(entries) > SHOWN else ""
    types = Counter(p.suffix.lower() or "(no suffix)" for p in files)
    kinds = ", ".join(f"{n} {suffix}" for suffix, n in types.most_common())
    return f"{', '.join(names)}{more} ({len(files)} file(s): {kinds or 'none'})"
