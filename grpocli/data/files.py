"""Local dataset files (.jsonl, .json, .parquet, .csv) read through `datasets`' packaged builders.

``path`` may hold ``{split}`` (``data/{split}.jsonl``) so that train and test come from their
own files, or name a directory, which `datasets` splits by file name (train.jsonl, test.jsonl;
see datasets' "data_files" pattern resolution).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    return datasets.load_dataset(builder, data_files=str(file), split="train", **load_args)


def _load_directory(directory: Path, split: str, load_args: dict[str, Any]) -> datasets.Dataset:
    import datasets

    try:
        return datasets.load_dataset(str(directory), split=split, **load_args)
    except ValueError as exc:
        if "split" not in str(exc).lower():
            raise
        raise UserError(
            f"directory {str(directory)!r} has no split {split!r} ({exc})",
            where="data.split",
            valid=_nearby(directory / "x"),
            hint="name the files after their splits (train.jsonl, test.jsonl) or set data.split",
        ) from None


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
