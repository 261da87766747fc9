"""Local dataset files (.jsonl, .json, .parquet, .csv) read through `datasets`' packaged builders.

``path`` may hold ``{split}`` (``data/{split}.jsonl``) so that train and test come from their
own files, or name a directory, which `datasets` splits by file name (train.jsonl, test.jsonl;
see datasets' "data_files" pattern resolution), or a folder written by ``Dataset.save_to_disk`` /
``DatasetDict.save_to_disk`` (grpocli.data.saved).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpocli.data.columns import mixed_type, mixed_type_error
from grpocli.data.defects import check_load_args, check_text, explain
from grpocli.data.saved import check_has_data, load_saved, saved_kind
from grpocli.errors import UserError

if TYPE_CHECKING:
    import datasets

#: File suffix -> `datasets` packaged builder.
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
NEARBY_SHOWN = 12


def load_local(split: str, seed: int, *, path: str, **load_args: Any) -> datasets.Dataset:
    """One split of a local file or directory; ``load_args`` go to ``datasets.load_dataset``."""
    import datasets

    file = Path(path.format(split=split) if "{split}" in path else path).expanduser()
    if file.is_dir():
        kind = saved_kind(file)
        if kind is not None:
            return load_saved(file, kind, split, load_args)
        return _load_directory(file, split, load_args)
    if not file.is_file():
        raise UserError(
            f"data file {str(file)!r} does not exist (looked from {Path.cwd()})",
            where="data.dataset",
            valid=_nearby(file),
            hint="fix the path; relative paths start at the directory `grpo` runs in",
        )
    builder = BUILDERS.get(file.suffix.lower())
    if builder is None:
        raise UserError(
            f"cannot read {str(file)!r}: unknown file type {file.suffix or '(no suffix)'!r}",
            where="data.dataset",
            valid=", ".join(sorted(BUILDERS)),
            hint="convert it with datasets: Dataset.from_...(...).to_json('data.jsonl')",
        )
    check_load_args(builder, load_args, file)
    check_text(file, load_args)
    try:
        with _reader_logs_quiet():
            dataset = datasets.load_dataset(builder, data_files=str(file), split="train", **load_args)
    except Exception as exc:  # noqa: BLE001 (the reader's failure, any type: named with the file)
        raise explain([file], exc, load_args) from None
    if len(dataset) == 0 and builder == "csv":  # a header and no rows, where datasets allows it
        raise explain([file], ValueError("the file has no rows"), load_args)
    _check_one_type(dataset, [file], load_args)
    return dataset


def _load_directory(directory: Path, split: str, load_args: dict[str, Any]) -> datasets.Dataset:
    import datasets

    check_load_args(None, load_args, directory)
    files = _data_files(directory)
    check_has_data(directory, files)
    _check_one_file_type(directory, files)
    for file in files:
        check_text(file, load_args)
    try:
        with _reader_logs_quiet():
            dataset = datasets.load_dataset(str(directory), split=split, **load_args)
    except ValueError as exc:
        if "split" not in str(exc).lower():
            raise explain(files, exc, load_args) from None
        raise UserError(
            f"directory {str(directory)!r} has no split {split!r} ({exc})",
            where="data.split",
            valid=_nearby(directory / "x"),
            hint="name the files after their splits (train.jsonl, test.jsonl) or set data.split",
        ) from None
    except Exception as exc:  # noqa: BLE001 (the reader's failure on one of the files)
        raise explain(files, exc, load_args) from None
    _check_one_type(dataset, files, load_args)
    return dataset


def _check_one_file_type(directory: Path, files: list[Path]) -> None:
    """`datasets` reads a directory with the reader of its most common file type and skips the
    files of any other type without a word (a test.csv beside train.jsonl is never read)."""
    kinds: dict[str, list[Path]] = {}
    for file in files:
        kinds.setdefault(BUILDERS[file.suffix.lower()], []).append(file)
    if len(kinds) < 2:
        return
    found = "; ".join(f"{builder}: {', '.join(str(f.relative_to(directory)) for f in group[:4])}"
                      + (f" and {len(group) - 4} more" if len(group) > 4 else "")
                      for builder, group in sorted(kinds.items()))
    raise UserError(
        f"the data directory {str(directory)!r} holds files of {len(kinds)} types ({found}); `datasets` would "
        "read one type and silently skip the others",
        where="data.dataset",
        valid="a directory of one file type (.jsonl and .json count as one), named by split: train.jsonl, "
        "test.jsonl",
        hint="convert the odd files to the type of the others, or move them out; or name one file per split "
        'with data.dataset = "data/{split}.jsonl"',
    )


def _check_one_type(dataset: datasets.Dataset, files: list[Path], load_args: dict[str, Any]) -> None:
    """A column that mixes types (which `datasets` keeps as JSON text, reading "1" back as 1), named
    by file, line and row as the JSON files hold it (only read where such a column was found)."""
    if not any(type(f).__name__ == "Json" for f in dataset.features.values()):
        return
    encoding = load_args.get("encoding") or "utf-8"
    for file in files:
        if BUILDERS.get(file.suffix.lower()) != "json":
            continue
        rows, lines = _json_rows(file, encoding)
        found = mixed_type(rows)
        if found is not None:
            raise mixed_type_error(found, str(file), line_of=lines)


def _json_rows(file: Path, encoding: str) -> tuple[list[dict[str, Any]], dict[int, int] | None]:
    """The objects of a JSON file (a list, or one per line) and, for JSON Lines, the line of each."""
    text = file.read_text(encoding=encoding, errors="replace")
    try:
        whole = json.loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, list):
        return [r for r in whole if isinstance(r, dict)], None
    rows, lines = [], {}
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                value = json.loads(line)
            except ValueError:
                continue  # `datasets` read the file, so this is not a row it holds
            if isinstance(value, dict):
                lines[len(rows)] = number
                rows.append(value)
    return rows, lines


def _data_files(directory: Path) -> list[Path]:
    """The data files under ``directory``: `datasets` builds every split of it at once, so a
    defect in any of them stops the load of each."""
    return sorted(
        p for p in directory.rglob("*")
        if p.suffix.lower() in BUILDERS and p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(directory).parts)
    )


@contextlib.contextmanager
def _reader_logs_quiet() -> Iterator[None]:
    """`datasets`' JSON reader logs each failure before raising it; the UserError says it once."""
    logger = logging.getLogger("datasets.packaged_modules.json.json")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _nearby(missing: Path) -> str:
    """What exists where ``missing`` was looked for: data files first, then anything."""
    folder = missing.parent
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return "(no existing parent directory)"
    try:
        entries = sorted(folder.iterdir(), key=lambda p: (p.suffix.lower() not in BUILDERS, p.name))
    except OSError:
        return f"(cannot list {folder})"
    names = [p.name + ("/" if p.is_dir() else "") for p in entries if not p.name.startswith(".")]
    if not names:
        return f"{folder}/ is empty"
    more = f", ... ({len(names) - NEARBY_SHOWN} more)" if len(names) > NEARBY_SHOWN else ""
    return f"in {folder}/: " + ", ".join(names[:NEARBY_SHOWN]) + more
