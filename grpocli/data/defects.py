"""Defects of local dataset files, named by file and line instead of by `datasets`' internals.

`datasets` reports a line that is not JSON as "An error occurred while generating the dataset",
an empty file as a bare StopIteration and a CSV with a header and no rows as 'Instruction
"train" corresponds to no data'; it reads bytes that are not UTF-8 without a word, and the
first row that holds them fails later, with a traceback. Here:

- ``check_load_args`` (before loading): ``data.args`` are keywords that `datasets` takes for
  this file type, so args left from a generator dataset (``num_samples``) are named;
- ``check_text`` (before loading, one streaming pass at disk speed): the file can be read,
  holds more than white space and decodes in its encoding (UTF-8 unless ``data.args.encoding``
  names another, as `datasets` does);
- ``explain`` (after `datasets` failed): the first line that is not a JSON object, a CSV with
  no rows, or else `datasets`' own message, always with the file named.
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import importlib
import inspect
import itertools
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from grpocli.errors import UserError, did_you_mean

#: Files read as text (parquet is binary: pyarrow checks its own strings).
TEXT_SUFFIXES = (".jsonl", ".json", ".csv")
CHUNK_BYTES = 1 << 20
SNIPPET_CHARS = 80
#: What each file type holds, for the ``valid:`` line.
FORMATS = {
    ".jsonl": 'one JSON object per line (JSON Lines), e.g. {"prompt": "What is 2+3?", "answer": "5"}',
    ".json": "a JSON list of objects, or one JSON object per line",
    ".csv": "a header line naming the columns (prompt,answer), then one row per line",
    ".parquet": "a Parquet file with a prompt column (datasets.Dataset.to_parquet writes one)",
}
#: `datasets` packaged module of each builder, and load_dataset keywords that are not the reader's.
READER_MODULES = {
    "json": "datasets.packaged_modules.json.json",
    "csv": "datasets.packaged_modules.csv.csv",
    "parquet": "datasets.packaged_modules.parquet.parquet",
}
SET_BY_GRPO = {"path", "name", "data_dir", "data_files", "split", "config_kwargs", "version",
               "description"}


def check_load_args(builder: str | None, load_args: Mapping[str, Any], path: Path) -> None:
    """UserError naming the ``data.args`` keys that `datasets` takes for no file of this type.

    ``builder`` is "json", "csv" or "parquet" for the file ``path``, or None for a directory.
    """
    accepted = accepted_load_args(builder)
    unknown = sorted(set(load_args) - accepted)
    if not unknown or not accepted:
        return
    kind = "file" if builder else "directory"
    raise UserError(
        f"data.args has {', '.join(map(repr, unknown))}, which the local data {kind} {str(path)!r} "
        f"does not take{did_you_mean(unknown[0], accepted)} (its args go to datasets.load_dataset)",
        where=f"data.args.{unknown[0]}",
        valid=f"datasets.load_dataset keywords for {builder or 'data files'}: "
        + ", ".join(sorted(accepted)),
        hint="args set for another dataset (such as num_samples of a built-in generator) stay "
        "when data.dataset changes: clear them with data.args={} after the recipe, or remove "
        "them from its [data] table",
    )


def accepted_load_args(builder: str | None) -> set[str]:
    """Keywords of ``datasets.load_dataset`` plus the fields of the reader's config class."""
    import datasets

    names = {
        n for n, p in inspect.signature(datasets.load_dataset).parameters.items()
        if p.kind is not p.VAR_KEYWORD
    }
    for module_name in [READER_MODULES[builder]] if builder else READER_MODULES.values():
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # another datasets layout: let datasets itself judge the args
            return set()
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, datasets.BuilderConfig)
                    and dataclasses.is_dataclass(value)):
                names |= {f.name for f in dataclasses.fields(value)}
    return names - SET_BY_GRPO


def check_text(file: Path, load_args: Mapping[str, Any]) -> None:
    """UserError when ``file`` cannot be read, is empty, or has bytes its encoding cannot decode."""
    suffix = file.suffix.lower()
    try:
        with file.open("rb") as stream:
            if suffix in TEXT_SUFFIXES:
                has_text = _decode_all(stream, file, load_args)
            else:
                has_text = bool(stream.read(1))
    except OSError as exc:
        raise UserError(
            f"cannot read the data file: {exc.strerror or exc}",
            where=str(file),
            hint=f"check the file's permissions (`ls -l {file}`) and that it is a regular file",
        ) from None
    if not has_text:
        raise UserError(
            "the data file is empty" + (" (only white space)" if file.stat().st_size else ""),
            where=str(file),
            valid=FORMATS.get(suffix, ""),
            hint="write the rows into it, or point data.dataset at the file that has them; then "
            f"check with `grpo inspect data RECIPE data.dataset={file}`",
        )


def _decode_all(stream: Any, file: Path, load_args: Mapping[str, Any]) -> bool:
    """Decode the whole stream in the file's encoding; True when it holds more than white space."""
    encoding = load_args.get("encoding") or "utf-8"
    strict = load_args.get("encoding_errors") in (None, "strict")
    try:
        decoder = codecs.getincrementaldecoder(encoding)(errors="strict" if strict else "replace")
    except LookupError:
        raise UserError(
            f"unknown text encoding {encoding!r}", where="data.args.encoding",
            valid="a Python codec name: utf-8 (the default), utf-8-sig, latin-1, cp1252, utf-16",
        ) from None
    offset, lines, line_start, has_text = 0, 0, 0, False
    while True:
        chunk = stream.read(CHUNK_BYTES)
        pending = len(decoder.getstate()[0])
        try:
            text = decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError as exc:
            at = offset - pending + exc.start
            head = chunk[: max(0, at - offset)]
            lines += head.count(b"\n")
            if b"\n" in head:
                line_start = offset + head.rfind(b"\n") + 1
            bad = exc.object[exc.start: exc.start + 1].hex()
            raise _not_decodable(file, encoding, bad, at, lines + 1, at - line_start + 1) from None
        has_text = has_text or bool(text.strip())
        if not chunk:
            return has_text
        lines += chunk.count(b"\n")
        if b"\n" in chunk:
            line_start = offset + chunk.rfind(b"\n") + 1
        offset += len(chunk)


def _not_decodable(file: Path, encoding: str, byte: str, offset: int, line: int, column: int
                   ) -> UserError:
    if codecs.lookup(encoding).name == "utf-8":
        encoding = "UTF-8"
    return UserError(
        f"the data file is not {encoding} text: byte 0x{byte} at offset {offset} (line {line}, "
        f"column {column}) cannot be decoded",
        where=f"{file}:{line}",
        valid=f"{encoding} text (`datasets` reads .jsonl, .json and .csv files as UTF-8 unless "
        "data.args.encoding names another encoding)",
        hint=f"convert the file to UTF-8 (`iconv -f latin1 -t utf-8 {file} > fixed{file.suffix}`), "
        'or name its encoding: data.args={encoding="latin-1"}',
    )


def explain(files: Iterable[Path], exc: BaseException, load_args: Mapping[str, Any]) -> UserError:
    """A UserError for `datasets`' failure ``exc`` to read ``files``: the defect found, or its cause."""
    files = list(files)
    encoding = load_args.get("encoding") or "utf-8"
    for file in files:
        found = _find_defect(file, encoding)
        if found is not None:
            return found
    cause = _innermost(exc)
    where = str(files[0]) if len(files) == 1 else ", ".join(map(str, files)) or "data.dataset"
    suffix = files[0].suffix.lower() if files else ""
    return UserError(
        f"`datasets` could not read the data file: {type(cause).__name__}: {cause}",
        where=where,
        valid=FORMATS.get(suffix),
        hint="fix the file, then check it with `grpo inspect data RECIPE data.dataset=FILE`",
    )


def csv_without_rows(file: Path, encoding: str = "utf-8") -> UserError | None:
    """A UserError when the CSV file has a header line (or nothing) and no rows, else None."""
    with file.open(encoding=encoding, errors="replace", newline="") as stream:
        rows = [r for r in itertools.islice(csv.reader(stream), 50) if any(c.strip() for c in r)][:2]
    if len(rows) > 1:
        return None
    header = ",".join(rows[0]) if rows else ""
    return UserError(
        f"the CSV file has a header line ({_snippet(header)}) and no rows",
        where=str(file),
        valid=FORMATS[".csv"],
        hint="add the rows under the header (or point data.dataset at the file that has them); "
        f"then check with `grpo inspect data RECIPE data.dataset={file}`",
    )


def _find_defect(file: Path, encoding: str) -> UserError | None:
    suffix = file.suffix.lower()
    try:
        if suffix == ".csv":
            return csv_without_rows(file, encoding)
        if suffix == ".jsonl" or (suffix == ".json" and not _whole_json_document(file, encoding)):
            return _first_bad_json_line(file, encoding)
    except (OSError, UnicodeDecodeError, LookupError):
        return None  # check_text names these; here only the format is judged
    return None


def _whole_json_document(file: Path, encoding: str) -> bool:
    """True when a .json file parses as one document (then `datasets` failed on something else)."""
    try:
        json.loads(file.read_text(encoding=encoding))
    except ValueError:
        return False
    return True


def _first_bad_json_line(file: Path, encoding: str) -> UserError | None:
    """The first non-blank line that is not a JSON object, as a UserError naming it."""
    with file.open(encoding=encoding, errors="replace") as stream:
        for number, line in enumerate(stream, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as err:
                problem = f"is not valid JSON: {err.msg} (column {err.colno})"
            else:
                if isinstance(value, dict):
                    continue
                problem = f"is a JSON {type(value).__name__}, not an object"
            return UserError(
                f"line {number} of the data file {problem}: {_snippet(line.strip())}",
                where=f"{file}:{number}",
                valid=FORMATS[".jsonl"] + "; a record may not span lines",
                hint=f"fix line {number} (later lines may need it too), then check the file with "
                f"`grpo inspect data RECIPE data.dataset={file}`",
            )
    return None


def _innermost(exc: BaseException) -> BaseException:
    """The exception at the bottom of ``exc``'s cause chain (`datasets` wraps the reader's)."""
    seen = {id(exc)}
    while (nxt := exc.__cause__ or exc.__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        exc = nxt
    return exc


def _snippet(text: str) -> str:
    return repr(text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 3] + "...")
